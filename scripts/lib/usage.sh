# shellcheck shell=bash
# -h / --help: print the calling script's header comment (its usage) and exit 0, before any
# setup, download, GPU probe or Python start. Every script sources this first:
#   source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"
# Pure bash (no sed, no python), so the answer is immediate. Arguments after `--` are left alone.
usage_of() {
    local line
    {
        read -r _  # the shebang
        while IFS= read -r line && [[ "$line" == \#* ]]; do
            line="${line#\#}"
            printf '%s\n' "${line# }"
        done
    } < "$1"
}

for _usage_arg in "$@"; do
    case "$_usage_arg" in
        -h|--help) usage_of "${BASH_SOURCE[1]}"; exit 0 ;;
        --) break ;;
    esac
done
unset _usage_arg
