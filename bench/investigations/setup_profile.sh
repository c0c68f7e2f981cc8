#!/usr/bin/env bash
# Where the set-up of `turnip generate --weights` (7b, 16 x 2048, N = 32, 4 GiB) goes, on a GPU machine
# (WHAT=llama: of `turnip llama --weights` 7b 8k / 2 GiB with --plan-dir):
#   source bench/gpu_setup.sh && bash bench/investigations/setup_profile.sh     # writes $OUT/sampled*.json
# Writes the random 7b folder (bench_coldstart's writer) unless there, runs the command once to fill the
# plan folder and the kernel cache, then once more under bench/investigations/sampled.py.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FOLDER=${FOLDER:-/tmp/turnip-genbench-7b}
if [ ! -f "$FOLDER/model.safetensors.index.json" ]; then
    python3 -c "
import sys, time; sys.path.insert(0, 'bench')
from pathlib import Path
from bench_coldstart import write_model
t = time.perf_counter(); write_model(Path('$FOLDER'), '7b', 0); print(f'wrote $FOLDER in {time.perf_counter() - t:.1f} s')"
fi
G="-m turnip_cli.main generate --weights $FOLDER --prompt-tokens 2048 --batch 16 --max-new-tokens 32 --memory 4GiB --backend cuda --seed 0 --plan-dir $FOLDER-plans ${EXTRA:-}"
PLANS=$FOLDER-plans
if [ "${WHAT:-generate}" = llama ]; then  # WHAT=llama: a second cold `turnip llama --weights` 8k / 2 GiB reading --plan-dir (issue 45)
    PLANS=$FOLDER-llama-plans
    G="-m turnip_cli.main llama --weights $FOLDER --tokens 8192 --memory 2GiB --backend cuda --seed 0 --plan-dir $PLANS ${EXTRA:-}"
fi
if [ ! -d "$PLANS" ]; then
    /usr/bin/time -f "first run: %e s wall" python3 $G
fi
/usr/bin/time -f "sampled run: %e s wall" python3 bench/investigations/sampled.py --json "$OUT/sampled${TAG:-}.json" --until ${UNTIL:-12} \
    --threads MainThread "turnip cache pinning" "turnip file locking" -- $G
