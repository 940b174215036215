//% _ENV = nil
${D}
