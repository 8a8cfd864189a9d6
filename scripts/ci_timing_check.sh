#!/usr/bin/env bash
# The tests that need a request still running (or a thread still waiting) when the test acts,
# run twice with the CPU loaded by busy loops: they must hold by construction (the engine held,
# events), never by the machine being slow. A test that passes only on a quiet or a slow machine
# fails here. Extra arguments go to pytest. LOAD=<n> busy loops (default 2); ~1.5 min on 2 otherwise idle cores.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
S=tests/sglang_kvc/server
TESTS=(
  "$S/test_exposure.py::test_disconnect_still_aborts_behind_the_key"
  "$S/test_disconnect_log.py"
  "$S/test_admission.py::test_full_queue_is_503_with_retry_after"
  "$S/test_admission.py::test_client_leaving_mid_generation_aborts_its_samples"
  "$S/test_admission.py::test_abort_all_is_prompt_with_a_deep_queue"
  "$S/test_http_control.py::test_abort_by_rid_and_all"
  "$S/test_http_control.py::test_abort_streaming_request"
  "$S/test_http_control.py::test_pause_and_continue"
  "$S/test_http_control.py::test_pause_retract_mid_generation_then_continue"
  "$S/test_cli_errors.py::test_sigterm_under_load_exits_promptly"
  "tests/trainer/rollout/engines/test_partial_engine.py::test_resumed_compressed_request_is_a_fresh_request_of_prompt_and_head"
  tests/trainer/rollout/test_async_rollout.py
  tests/trainer/rollout/test_partial.py
)
LOOPS=()
stop_load() { for pid in ${LOOPS[@]+"${LOOPS[@]}"}; do kill "$pid" 2>/dev/null || true; done; }
trap stop_load EXIT
for _ in $(seq "${LOAD:-2}"); do
  "$PY" -c 'while True: pass' &
  LOOPS+=("$!")
done
for round in 1 2; do
  echo "timing check, round $round of 2, under ${LOAD:-2} busy loops"
  "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
done
