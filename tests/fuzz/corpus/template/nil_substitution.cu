int x = ${undefined_name};
