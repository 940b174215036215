-- loop.lua: an endless loop, for the sandbox test of import().
while true do end
