//% return 5
after return
