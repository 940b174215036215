#!/usr/bin/env bash
# Throwaway: expands templates/la_fwd/fwd.cu for every line of a variants file, compiles each to
# an sm_90a cubin (ptxas report kept), builds fwd_probe, and writes run.sh, into OUTDIR.
# Usage: build_fwd_probe.sh VARIANTS OUTDIR
set -eu
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
vars=$1; out=$2
mkdir -p "$out"; rm -f "$out"/*.cubin "$out"/ptxas.log
nvcc -O2 -std=c++17 -o "$out/fwd_probe" "$here/fwd_probe.cu" -lcuda
echo '#!/usr/bin/env bash' > "$out/run.sh"; echo 'cd "$(dirname "$0")"; OUT=${OUT:-/tmp}; fails=0' >> "$out/run.sh"
while read -r mode name dt D E BL TV W S MB dec ini fin vl vk bnhd B H Ns; do
  [ -n "$mode" ] || continue
  case $dt in f32) el=float;; f16) el=lj_f16;; bf16) el=lj_bf16;; esac
  python3 "$here/expand_fwd.py" "$root/templates/la_fwd/fwd.cu" "$out/$name.cu" ELEM=$el D=$D E=$E BLOCK=$BL \
     TILE_V=$TV WARPS=$W STAGES=$S MINB=$MB DECAY=$dec HAS_INITIAL=$ini HAS_FINAL=$fin VARLEN=$vl
  ( nvcc -std=c++17 -O3 -cubin -gencode=arch=compute_90a,code=sm_90a -I "$root/templates" -Xptxas -v \
      "$out/$name.cu" -o "$out/$name.cubin" 2>&1 | grep -E "error|registers|spill" | sed "s/^/$name: /" >> "$out/ptxas.log" ) &
  echo "./fwd_probe $mode $name.cubin $dt $D $E $BL $TV $W $S $dec $ini $fin $vl $vk $bnhd $B $H $Ns > \$OUT/$name.log 2>&1 || { fails=\$((fails+1)); echo \"$name FAILED\"; }; grep -vE '^PASS|^TIME|^# time' \$OUT/$name.log | head -20; cat \$OUT/$name.log >> \$OUT/all.txt; rm \$OUT/$name.log" >> "$out/run.sh"
  while [ "$(jobs -r | wc -l)" -ge 8 ]; do sleep 0.2; done
done < <(grep -v '^#' "$vars")
wait
rm -f "$out"/*.cu
echo 'echo "checks/timings failed: $fails"' >> "$out/run.sh"; chmod +x "$out/run.sh"
cat >> "$out/run.sh" <<'EOS'
echo "checks: $(grep -c '^PASS' $OUT/all.txt) PASS lines, $(grep -c '^FAIL' $OUT/all.txt) FAIL lines"
grep -E '^TIME' $OUT/all.txt | sed -E 's/TIME D=([0-9]+) E=[0-9]+ N=([0-9]+) +BLOCK=([0-9]+) TILE_V=([0-9]+) WARPS=([0-9]+) STAGES=([0-9]+) +ms=([0-9.]+) +floor=[0-9.]+ +%floor=([0-9.]+).*/D\1 B\3 V\4 W\5 S\6 N\2 \7 \8%/' | awk '{k=$1" "$2" "$3" "$4" "$5; row[k]=row[k]" "$7"("$8")"} END {for (k in row) print k":"row[k]}' | sort
EOS
