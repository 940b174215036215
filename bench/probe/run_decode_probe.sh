#!/bin/sh
# Runs the decode probe on the GPU machine (from the folder holding decode_probe, e.g.
# cd .devwork/decode && ./run_decode_probe.sh); full log in $OUT/probe.log.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/smi.txt 2>&1
cat $OUT/smi.txt
./decode_probe all > $OUT/probe.log 2>&1; rc=$?
grep -E 'FAIL|check:' $OUT/probe.log
sed -n '/== pass 1/,$p' $OUT/probe.log
exit $rc
