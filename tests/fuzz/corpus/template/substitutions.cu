// substitutions of every kind
constexpr int D = ${problem.D};
constexpr int E = ${problem.E}, W = ${WARPS} * 32;
constexpr float S = ${SCALE};
constexpr bool DECAY = ${problem.decay};
const char *dt = "${problem.dtype}";
int t = ${tiles[2] + #tiles};
literal $${ and $$ and $ alone
