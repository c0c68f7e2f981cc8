#!/usr/bin/env bash
# The GPU benchmark calls, stage by stage, each with its own time limit; logs and JSON go to $OUT.
#   source bench/gpu_setup.sh && bash bench/gpu_bench.sh tests kernels llama8k llama32k
# Stages: tests (GPU tests of the llama, attention, random graphs, memory, two GPUs), kerneltests (the GPU
# tests of the numba kernels, the attention providers and llama), kernels (memory-bound kernels, attention
# providers, the 2-GPU blocked matmul), depth8k (llama 8k at 2 GiB with the copy lanes 2, 4 and 8 deep),
# llama8k, llama32k, llama128k, prefetch128k, severe (issue 11, one GPU), tritontests (the triton attention
# provider's GPU tests), below2 (llama 32k under 2 GiB), hfpoints (llama 8k at 8 GiB with hf-offload at
# both of its working points),
# llama2gpu (issue 12: 8k and 32k over 2 GPUs, two placements), ffn (the transfer-bound FFN),
# peerbig (issue 12: the blocked matmul 49152^3 fp32 over 2 GPUs, seconds per run), exitcheck (issue 12:
# which step of a 2-GPU process aborts at exit; bench/investigations/exit_check.py), llama2gpu1 and llama2gpuz (issue 12:
# one GPU, then zigzag and sequence over two, at 4 GiB per GPU with torch-resident, in one call; the 2-GPU
# outputs are compared with the 1-GPU turnip output saved in /tmp/turnip-1gpu),
# schedules (llama 8k and 32k at 1 GiB planned with the given and the memory schedule), quick128k (128k at
# 4 GiB, turnip-nondet once),
# attntests (the GPU tests of the merge and the triton provider), attnbench (the merge, the triton tile
# sweep and the providers; the chosen tile shape goes to $OUT/triton-config), providers8k and providers32k
# (llama at 8k / 2 GiB and 32k / 4 GiB with the torch-cudnn and the triton provider), llama32k8 (32k at 8 GiB),
# notifiers (the PCIe-bound runs, ffn at 8k and llama at 8k, with the host function on a side stream, on
# the lane's stream, and the polling notifier), notifiers32k (llama 32k at 4 GiB, compute-bound, with both
# host-function placements; then bench_cuda.py notifiers: latency per vertex and the stress test),
# bf16 (issue 25: the bfloat16 GPU tests, then llama 7b at 8k / 2 GiB in bfloat16 and in float16, for the
# target "bf16 within 1.05x of fp16"; 3 minutes at most).
# generatetests (issue 28: teacher-forced fp16 logits of a small model on the GPU against float32, the
# largest error per step printed; the decode_attention kernel at 7b's head sizes), generate (issue 28:
# bench/bench_generate.py, 7b B=16 P=2048 N=32, turnip at 4, 16 and 40 GiB against the torch streaming
# and resident decoders and the PCIe floor), generate64 (B=64 P=512), generateragged (16 ragged prompts
# of 1024-2048 tokens at 4 GiB, nondet against fixed), generateinterfere (the same while a second process copies to
# the GPU in bursts, bench_interference.py's interferer: issue 26), generatehf (HF transformers + accelerate offload, default and offloaded cache,
# at 4 GiB beside the torch decoders and turnip, B=16 P=2048),
# interference (issue 26: llama 7b at 8k / 2 GiB, and 32k / 1 GiB in halves, 5 quiet nondet runs, then nondet and
# fixed taking turns, 5 runs each, while a second process copies pinned memory to the same GPU in seeded bursts;
# its rate and the bound on any order are reported), interference2gpu (nvidia-h200-x2: the same over two GPUs in
# the sequence placement, 8k and 32k at 4 GiB and 32k at 1 GiB per GPU, with the interferer on GPU 0's link, the one
# GPU 1 waits on),
# coldstart (issue 25: bench/bench_coldstart.py, a 7b fp16 safetensors folder written to /tmp, `cp` of it
# to /dev/null, `turnip llama --weights` at 8k / 2 GiB in two fresh processes with their phases, and a torch
# script loading the same files into pinned memory and running the prefetch prefill; 5 minutes at most),
# coldprofile (coldstart keeping its folder in /tmp/cold7b, then one more `turnip llama --weights` under cProfile and
# -X importtime: $OUT/cold.prof, cold-profile.txt, the import times in coldprofile.log), pinprobe (how fast host memory
# is page-locked each way: bench/investigations/pin_probe.py), decodeprofile (decode_profile.py at 40 GiB), warmcache (issue 25: the kernel cache emptied, `python3 -m tools.warm_cache`
# timed, then `turnip llama --config 7b` at 8k / 2 GiB, whose prepare line shows whether kernels were built or loaded), kernels16
# (issue 25: the memory-bound kernels in float16 and in bfloat16 against the HBM copy rate),
# tight (issue 26: llama 7b at 8k / 1 GiB and 32k / 1 GiB in the layer order, query group, block and schedule the
# sim ranks fastest there, then the loose points the targets compare with: 8k at 2 and 4 GiB, 32k at 2, 8 and 16
# GiB), tight32k4096 (32k at 1 GiB in halves in the default 4096-token blocks), tight128k (issue 26: 128k at
# 2 GiB in halves and query groups of 8, and at 16 GiB; one run each), tight8ktriton (8k at 1 and 4 GiB with the
# triton attention provider, whose workspace is smaller than torch-cudnn's), start8k (8k at 2 GiB with
# the weights starting on the GPU while they fit, as `turnip llama` plans), autollama (`turnip llama` choosing block,
# layer order and query group by the sim at 32k / 1 GiB, and layer order and query group at 128k / 2 GiB, then running),
# pair8k (8k at 1 and 4 GiB in one process, halves, query groups of 2, the memory schedule, torch-cudnn), pair128k (128k
# at 2 and 16 GiB in one process, halves, query groups of 8; one run each), smallest (128k at 1 GiB in halves and
# query groups of 8, 32k at 0.5 GiB in halves: below the smallest budgets measured before; one run each),
# pair32ktriton (pair32k with the triton attention provider, which `--attention auto` ranks against torch-cudnn),
# floor8k (8k at 2 GiB in the defaults, 5 runs, with only the weights in host memory (`--inputs weights`, the
# default) and then every input (`--inputs host`): the target within 1.02x of the PCIe floor), cli8ktriton
# (`turnip llama` at 8k / 1 GiB in halves, query groups of 2 and the memory schedule with the triton provider
# named, for the plan whose auto choice took torch-cudnn), floor8ktrace (floor8k's weights run with its nondet
# trace in $OUT/traces8k, for bench/investigations/link_gaps.py, then the same with the copy lanes 8 deep),
# gensession (`turnip generate --config 7b`, 4 prompts of 2048 tokens, 4 new tokens, at 1 and at 4 GiB: the
# session ranks the attention providers at its first plan and prints its choice), kerneltraces (issue 26: both
# orders' traces of 7b at 8k / 4 GiB, 32k / 8 GiB in halves and 128k / 16 GiB in halves and query groups of 8,
# torch-cudnn named, into $OUT/ktraces.tgz, for bench/investigations/kernel_rates.py), ktracetriton (the same at
# 32k / 8 GiB with the triton provider, into $OUT/ttraces.tgz), loose32khost (32k at 8 GiB in halves with every
# input from the host, a third call for that point of bench/fit_cost.py), depth3 (32k at 8 GiB and 1 GiB in halves, 8k at
# 2 GiB, with the compute lanes 3 deep instead of 2), depthab (32k at 8 and 1 GiB in halves, 8k at 2 GiB, 8k at 1 GiB in
# halves, query groups of 2 and the memory schedule: each with the compute lanes 2 and then 3 deep, in one call; the
# JSON in $OUT/depthab.tgz), ropecheck (rope by quads: the PTX test, the llama GPU tests on torch-cudnn, 32k at 8 GiB
# in halves with both orders' traces in $OUT/rtraces.tgz, then the memory-bound kernels' rates), sharedstream (torch's
# attention on one stream per GPU: the GPU tests of the torch providers, the llama prefill and the memory promise, then
# library_probe.py for torch-cudnn at 1 and 3 lanes, blocks of 2048 and 4096), streamab (torch's attention on the GPU's
# one stream against each lane's own, TURNIP_ATTENTION_STREAM=gpu|lane: 8k at 2 GiB twice each in turn, 32k at 1 GiB in
# halves once each; the JSON and logs in $OUT/streamab.tgz),
# generation (issue 44: bench/bench_generation.py, every stage: the hand-written streaming prefill checked and timed with
# the streaming decoder, the session's 16 x 2048 / 64 x 512 calls and `turnip llama` 32k, batch 1 at 8k against the weight
# floor, `turnip generate --weights` as a child three times, the budget check sampled by nvidia-smi; about 5-7 minutes,
# nothing new after 390 s; the 7b folder stays in /tmp for a second call), generationquick (the same script on the tiny-gqa
# config and small shapes on the GPU: every code path in a minute or two).
# traintests (issue 46: the GPU tests of the training kernels: each at LLaMA's widths, attention_grad on its three
# paths, a small model's LoRA step against the cpu backend, the memory promise of a step), train (issue 46:
# bench/bench_train.py, attention_grad's rates on each path, then 7b fp16 LoRA rank 16 on q,k,v,o at 4096 and
# 16384 tokens: turnip at 8 and 4 GiB in both orders against the hand streaming trainer (uncapped and capped),
# resident autograd, transformers + peft and the floors; 9.5 minutes at most, the table printed whatever ran),
# train4k and train16k (the same, one length each, without the kernel rates).
OUT=${OUT:-out}
mkdir -p "$OUT"
stage() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "(rc $?)"; tail -n 25 "$OUT/$name.log"; }
for s in "$@"; do
  case $s in
    tests) stage tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 150 tests/test_cuda_gpu.py \
             -k "llama or providers or random_graphs or allocated or two" ;;
    kerneltests) stage kerneltests 180 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 120 tests/test_cuda_gpu.py \
             -k "unrolled or merge or random_graphs_under or every_notifier or hundred_thousand or providers or (llama_prefill and not two)" ;;
    depth8k) for d in 2 4 8; do stage "depth8k-$d" 70 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 3 --copy-depth $d \
             --systems turnip-nondet turnip-fixed floor --json "$OUT/depth8k-$d.json"; done ;;
    tests2) stage tests2 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rA --timeout 100 tests/test_cuda_gpu.py \
             -k "llama or two_gpus or faults or ctrl_c" ;;
    peer) stage peer 60 python3 bench/bench_cuda.py peer --quick --json "$OUT/peer.json" ;;
    peerbig) stage peerbig 300 python3 bench/bench_cuda.py peer --json "$OUT/peerbig.json" ;;
    exitcheck) stage exitcheck 300 python3 bench/investigations/exit_check.py --json "$OUT/exitcheck.json" ;;
    repeatcheck) stage repeatcheck 300 python3 bench/investigations/repeat_check.py --json "$OUT/repeatcheck.json" ;;
    llama2gpu1) for t in 8192 32768; do stage "llama2gpu1-$t" 150 python3 bench/run.py llama --tokens $t --budgets 4 --repeats 2 \
             --gpus 1 --systems turnip-nondet turnip-fixed torch-resident floor --save-outputs /tmp/turnip-1gpu --json "$OUT/llama2gpu1-$t.json"; done ;;
    llama2gpuz) for p in zigzag sequence; do stage "llama2gpuz-$p" 200 python3 bench/run.py llama --tokens 8192 32768 --budgets 4 \
             --repeats 2 --gpus 2 --placement $p --systems turnip-nondet turnip-fixed torch-resident floor --compare-outputs /tmp/turnip-1gpu --traces "$OUT/traces-$p" \
             --json "$OUT/llama2gpuz-$p.json"; done ;;
    trace8k) stage trace8k 90 python3 bench/run.py llama --tokens 8192 --budgets 2 8 --repeats 1 --systems turnip-nondet floor \
             --traces "$OUT" --json "$OUT/trace8k.json" ;;
    kernels) stage kernels 150 python3 bench/bench_cuda.py kernels merge attention peer --quick --json "$OUT/kernels.json" ;;
    llama8k) stage llama8k 230 python3 bench/run.py llama --tokens 8192 --budgets 2 4 --hf-points 2 --json "$OUT/llama8k.json" ;;
    llama32k) stage llama32k 230 python3 bench/run.py llama --tokens 32768 --budgets 2 4 16 --repeats 3 \
             --systems turnip-nondet turnip-fixed torch-prefetch torch-resident floor --json "$OUT/llama32k.json" ;;
    llama128k) stage llama128k 260 python3 bench/run.py llama --tokens 131072 --budgets 4 --prefetch-budgets 16 --repeats 3 \
             --systems turnip-nondet turnip-fixed torch-prefetch floor --json "$OUT/llama128k.json" ;;
    prefetch128k) stage prefetch128k 330 python3 bench/run.py llama --tokens 131072 --budgets 4 --prefetch-budgets 20 32 --repeats 2 \
             --systems turnip-nondet torch-prefetch floor --json "$OUT/prefetch128k.json" ;;
    tritontests) stage tritontests 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 150 tests/test_cuda_gpu.py -k triton ;;
    below2) stage below2 150 python3 bench/run.py llama --tokens 32768 --budgets 1 0.5 --repeats 1 --systems turnip-nondet floor \
             --json "$OUT/below2.json" ;;
    hfpoints) stage hfpoints 200 python3 bench/run.py llama --tokens 8192 --budgets 8 --hf-points 7 2 \
             --systems turnip-nondet turnip-fixed torch-prefetch torch-resident hf-offload floor --json "$OUT/hfpoints.json" ;;
    llama2gpu) for p in sequence layers; do stage "llama2gpu-$p" 150 python3 bench/run.py llama --tokens 8192 32768 --budgets 4 \
             --repeats 1 --gpus 2 --placement $p --systems turnip-nondet turnip-fixed floor --json "$OUT/llama2gpu-$p.json"; done ;;
    ffn) stage ffn 150 python3 bench/run.py ffn --tokens 2048 8192 --budgets 8 --repeats 2 --systems turnip-nondet turnip-fixed torch-prefetch hf-offload floor --json "$OUT/ffn.json" ;;
    severe) stage severe32k 70 python3 bench/run.py llama --tokens 32768 --budgets 2 --repeats 1 --systems turnip-nondet floor --json "$OUT/severe32k.json"
            stage severe128k 250 python3 bench/run.py llama --tokens 131072 --budgets 2 --repeats 1 --systems turnip-nondet floor --json "$OUT/severe128k.json" ;;
    attntests) stage attntests 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 150 tests/test_cuda_gpu.py -k "merge or triton" ;;
    attnbench) stage attnbench 200 python3 bench/bench_cuda.py merge triton attention --json "$OUT/attn.json"
             python3 -c "import json; print(json.load(open('$OUT/attn.json')).get('triton', {}).get('chosen', ''))" > "$OUT/triton-config" ;;
    providers8k) export TURNIP_TRITON_ATTENTION=$(cat "$OUT/triton-config" 2>/dev/null); for p in torch-cudnn triton; do
             stage "providers8k-$p" 80 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 3 --attention $p \
             --systems turnip-nondet floor --json "$OUT/providers8k-$p.json"; done ;;
    providers32k) export TURNIP_TRITON_ATTENTION=$(cat "$OUT/triton-config" 2>/dev/null); for p in torch-cudnn triton; do
             stage "providers32k-$p" 110 python3 bench/run.py llama --tokens 32768 --budgets 4 --repeats 3 --attention $p \
             --systems turnip-nondet floor --json "$OUT/providers32k-$p.json"; done ;;
    notifiers) for n in hostfunc-side hostfunc poll; do stage "notifiers-$n" 100 python3 bench/run.py ffn --tokens 8192 --budgets 8 --repeats 3 \
             --notifier $n --systems turnip-nondet floor --json "$OUT/notifiers-$n.json"; done
             for n in hostfunc-side hostfunc poll; do stage "notifiers8k-$n" 80 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 3 \
             --notifier $n --systems turnip-nondet turnip-fixed floor --json "$OUT/notifiers8k-$n.json"; done ;;
    notifiers32k) for n in hostfunc-side hostfunc; do stage "notifiers32k-$n" 110 python3 bench/run.py llama --tokens 32768 --budgets 4 --repeats 3 \
             --notifier $n --systems turnip-nondet floor --json "$OUT/notifiers32k-$n.json"; done
             stage notifierlatency 150 python3 bench/bench_cuda.py notifiers --json "$OUT/notifierlatency.json" ;;
    schedules) for sc in given memory; do stage "schedules-$sc" 150 python3 bench/run.py llama --tokens 8192 32768 --budgets 1 --repeats 2 \
             --schedule $sc --systems turnip-nondet turnip-fixed floor --json "$OUT/schedules-$sc.json"; done ;;
    quick128k) stage quick128k 150 python3 bench/run.py llama --tokens 131072 --budgets 4 --repeats 1 --systems turnip-nondet floor \
             --json "$OUT/quick128k.json" ;;
    generatetests) stage generatetests 150 python3 -m pytest -m gpu -q -s -p no:cacheprovider -rfE --timeout 140 tests/test_generate_gpu.py \
             tests/test_decode_attention.py ;;
    generate) stage generate 330 python3 bench/bench_generate.py --budgets 4 16 40 --prefills 1 --time-limit 290 \
             --json "$OUT/generate.json" ;;
    generate64) stage generate64 200 python3 bench/bench_generate.py --shapes 64x512 --budgets 4 16 --prefills 0 --time-limit 170 \
             --json "$OUT/generate64.json" ;;
    generateragged) stage generateragged 200 python3 bench/bench_generate.py --shapes 16x2048:ragged --budgets 4 --orders nondet fixed \
             --time-limit 170 --json "$OUT/generateragged.json" ;;
    generateinterfere) stage generateinterfere 200 python3 bench/bench_generate.py --shapes 16x2048:ragged --budgets 4 --orders nondet fixed \
             --interfere --time-limit 170 --json "$OUT/generateinterfere.json" ;;
    generatehf) stage generatehf 300 python3 bench/bench_generate.py --budgets 4 --prefills 0 --hf --hf-steps 4 --time-limit 280 \
             --json "$OUT/generatehf.json" ;;
    coldstart) stage coldstart 300 python3 bench/bench_coldstart.py --tokens 8192 --memory 2GiB --timeout 100 --json "$OUT/coldstart.json" ;;
    coldprofile) stage coldstart 300 python3 bench/bench_coldstart.py --tokens 8192 --memory 2GiB --timeout 100 --folder /tmp/cold7b \
             --json "$OUT/coldstart.json"
             stage coldprofile 150 python3 -X importtime -m cProfile -o "$OUT/cold.prof" -m turnip_cli.main llama --weights /tmp/cold7b \
             --input-ids /tmp/cold7b/ids.npy --memory 2GiB
             python3 -c "import pstats, sys; s = pstats.Stats('$OUT/cold.prof', stream=sys.stdout); s.sort_stats('cumulative').print_stats(70); s.sort_stats('tottime').print_stats(40)" \
             > "$OUT/cold-profile.txt" 2>&1 ;;
    kernels16) stage kernels16 150 python3 bench/bench_cuda.py kernels --json "$OUT/kernels16.json" ;;
    pinprobe) stage pinprobe 150 python3 bench/investigations/pin_probe.py 4 ;;
    decodeprofile) stage decodeprofile 200 python3 bench/investigations/decode_profile.py 40 ;;
    warmcache) stage warmcache 240 bash -c 'rm -f runtime/backends/cuda/__pycache__/kernels_numba.*.nb[ci];
             TIMEFORMAT="warm_cache %R s"; time python3 -m tools.warm_cache;
             echo "kernel cache entries: $(ls runtime/backends/cuda/__pycache__/kernels_numba.*.nbi 2>/dev/null | wc -l)";
             TIMEFORMAT="turnip llama after it %R s"; time python3 -m turnip_cli.main llama --config 7b --tokens 8192 --memory 2GiB | grep -E "prepare|wall"' ;;
    llama32k8) stage llama32k8 150 python3 bench/run.py llama --tokens 32768 --budgets 8 --repeats 3 \
             --systems turnip-nondet turnip-fixed torch-prefetch floor --json "$OUT/llama32k8.json" ;;
    interference) stage interference8k 200 python3 bench/bench_interference.py --points 8192@2GiB --repeats 5 \
             --json "$OUT/interference8k.json"
             stage interference32k 250 python3 bench/bench_interference.py --points 32768@1GiB --layer-order halves --repeats 5 \
             --json "$OUT/interference32k.json" ;;
    interference2gpu) stage interference2gpu 420 python3 bench/bench_interference.py --gpus 2 --placement sequence \
             --points 8192@4GiB 32768@4GiB 32768@1GiB --interfere-on 0 --repeats 3 --json "$OUT/interference2gpu.json" ;;
    tight) stage tight8k 110 python3 bench/run.py llama --tokens 8192 --budgets 1 --layer-order halves --query-group 2 --schedule memory \
             --repeats 3 --systems turnip-nondet turnip-fixed floor --json "$OUT/tight8k.json"
           stage loose8k 120 python3 bench/run.py llama --tokens 8192 --budgets 2 4 --repeats 3 --systems turnip-nondet turnip-fixed floor \
             --json "$OUT/loose8k.json"
           stage tight32k 130 python3 bench/run.py llama --tokens 32768 --budgets 1 --block 2048 --layer-order halves --repeats 2 \
             --systems turnip-nondet turnip-fixed floor --json "$OUT/tight32k.json"
           stage loose32k 170 python3 bench/run.py llama --tokens 32768 --budgets 2 8 16 --repeats 2 --systems turnip-nondet turnip-fixed floor \
             --json "$OUT/loose32k.json" ;;
    tight32k4096) stage tight32k4096 130 python3 bench/run.py llama --tokens 32768 --budgets 1 --layer-order halves --repeats 2 \
             --systems turnip-nondet turnip-fixed floor --json "$OUT/tight32k4096.json" ;;
    tight8ktriton) stage tight8ktriton 120 python3 bench/run.py llama --tokens 8192 --budgets 1 4 --attention triton --layer-order halves \
             --query-group 2 --schedule memory --repeats 3 --systems turnip-nondet turnip-fixed floor --json "$OUT/tight8ktriton.json" ;;
    start8k) stage start8k 100 python3 bench/run.py llama --tokens 8192 --budgets 2 --inputs gpu --repeats 3 \
             --systems turnip-nondet turnip-fixed floor --json "$OUT/start8k.json" ;;
    autollama) stage auto32k 200 python3 -m turnip_cli.main llama --config 7b --tokens 32768 --memory 1GiB --block auto --layer-order auto \
             --query-group auto --repeats 3
           stage auto128k 240 python3 -m turnip_cli.main llama --config 7b --tokens 131072 --memory 2GiB --layer-order auto --query-group auto \
             --repeats 3 ;;
    pair32k) stage pair32k 200 python3 bench/run.py llama --tokens 32768 --budgets 1 8 --layer-order halves --repeats 3 \
             --systems turnip-nondet turnip-fixed floor --traces "$OUT/traces32k" --json "$OUT/pair32k.json" ;;
    pair32ktriton) stage pair32ktriton 200 python3 bench/run.py llama --tokens 32768 --budgets 1 8 --layer-order halves --repeats 3 \
             --attention triton --systems turnip-nondet turnip-fixed floor --traces "$OUT/traces32ktriton" --json "$OUT/pair32ktriton.json" ;;
    pair8k) stage pair8k 150 python3 bench/run.py llama --tokens 8192 --budgets 1 4 --layer-order halves --query-group 2 --schedule memory \
             --repeats 3 --systems turnip-nondet turnip-fixed floor --json "$OUT/pair8k.json" ;;
    floor8k) stage floor8k 150 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 5 --inputs weights \
             --systems turnip-nondet turnip-fixed floor --json "$OUT/floor8k.json"
             stage floor8khost 150 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 5 --inputs host \
             --systems turnip-nondet turnip-fixed floor --json "$OUT/floor8khost.json" ;;
    floor8ktrace) stage floor8ktrace 150 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 5 \
             --systems turnip-nondet turnip-fixed floor --traces "$OUT/traces8k" --json "$OUT/floor8ktrace.json"
             stage floor8kdepth8 150 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 5 --copy-depth 8 \
             --systems turnip-nondet turnip-fixed floor --json "$OUT/floor8kdepth8.json" ;;
    kerneltraces) for spec in "8192 4 blocks 1 100" "32768 8 halves 1 150" "131072 16 halves 8 240"; do set -- $spec
             stage "ktrace$(($1 / 1024))k" $5 python3 bench/run.py llama --tokens $1 --budgets $2 --layer-order $3 --query-group $4 \
             --repeats $([ $1 -gt 32768 ] && echo 1 || echo 3) --attention torch-cudnn --systems turnip-nondet turnip-fixed floor \
             --traces "$OUT/ktraces" --json "$OUT/ktrace$(($1 / 1024))k.json"; done
             tar -czf "$OUT/ktraces.tgz" -C "$OUT" ktraces && rm -r "$OUT/ktraces"; ls -la "$OUT" ;;
    ktracetriton) stage ktracetriton 150 python3 bench/run.py llama --tokens 32768 --budgets 8 --layer-order halves --repeats 3 \
             --attention triton --systems turnip-nondet turnip-fixed floor --traces "$OUT/ttraces" --json "$OUT/ktracetriton.json"
             tar -czf "$OUT/ttraces.tgz" -C "$OUT" ttraces && rm -r "$OUT/ttraces" ;;
    loose32khost) stage loose32khost 120 python3 bench/run.py llama --tokens 32768 --budgets 8 --layer-order halves --repeats 3 \
             --inputs host --systems turnip-nondet turnip-fixed floor --json "$OUT/loose32khost.json" ;;
    depth3) for spec in "32768 8 halves" "8192 2 blocks" "32768 1 halves"; do set -- $spec
             stage "depth3-$(($1 / 1024))k$2" 150 python3 bench/run.py llama --tokens $1 --budgets $2 --layer-order $3 --repeats 3 \
             --queue-depth 3 --systems turnip-nondet turnip-fixed floor --json "$OUT/depth3-$(($1 / 1024))k$2.json"; done ;;
    depthab) mkdir -p "$OUT/ab"; for spec in "32768 8 halves 1 given" "32768 1 halves 1 given" "8192 2 blocks 1 given" "8192 1 halves 2 memory"; do set -- $spec
             for q in 2 3; do stage "depthab-$(($1 / 1024))k$2-q$q" 120 python3 bench/run.py llama --tokens $1 --budgets $2 --layer-order $3 \
             --query-group $4 --schedule $5 --repeats 3 --queue-depth $q --systems turnip-nondet turnip-fixed floor \
             --json "$OUT/ab/depthab-$(($1 / 1024))k$2-q$q.json"; done; done
             mv "$OUT"/depthab-*.log "$OUT/ab/"; tar -czf "$OUT/depthab.tgz" -C "$OUT" ab && rm -r "$OUT/ab" ;;
    sharedstream) stage sharedtests 180 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 150 tests/test_cuda_gpu.py \
             -k "torch_attention or providers or allocated or (llama_prefill and not two)"
             stage libprobe 130 python3 bench/investigations/library_probe.py --providers torch-cudnn --sizes 2048 4096 --streams 1 3 ;;
    streamab) mkdir -p "$OUT/sab"; for run in gpu-1 lane-1 gpu-2 lane-2; do TURNIP_ATTENTION_STREAM=${run%-*} stage "streamab-8k2-$run" 90 \
             python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 5 --systems turnip-nondet turnip-fixed floor --json "$OUT/sab/streamab-8k2-$run.json"; done
             for mode in lane gpu; do TURNIP_ATTENTION_STREAM=$mode stage "streamab-32k1-$mode" 120 python3 bench/run.py llama --tokens 32768 \
             --budgets 1 --layer-order halves --repeats 3 --systems turnip-nondet turnip-fixed floor --json "$OUT/sab/streamab-32k1-$mode.json"; done
             mv "$OUT"/streamab-*.log "$OUT/sab/"; tar -czf "$OUT/streamab.tgz" -C "$OUT" sab && rm -r "$OUT/sab" ;;
    ropecheck) stage ropeptx 90 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_ptx.py
             stage ropegpu 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_cuda_gpu.py -k "llama_prefill and torch-cudnn"
             stage rope32k 120 python3 bench/run.py llama --tokens 32768 --budgets 8 --layer-order halves --repeats 3 \
             --systems turnip-nondet turnip-fixed floor --traces "$OUT/rtraces" --json "$OUT/rope32k.json"
             tar -czf "$OUT/rtraces.tgz" -C "$OUT" rtraces && rm -r "$OUT/rtraces"
             stage ropekernels 100 python3 bench/bench_cuda.py kernels --json "$OUT/ropekernels.json" ;;
    gensession) stage gensession1 150 python3 -m turnip_cli.main generate --config 7b --prompt-tokens 2048 --batch 4 \
             --max-new-tokens 4 --memory 1GiB
             stage gensession4 150 python3 -m turnip_cli.main generate --config 7b --prompt-tokens 2048 --batch 4 \
             --max-new-tokens 4 --memory 4GiB ;;
    cli8ktriton) stage cli8ktriton 120 python3 -m turnip_cli.main llama --config 7b --tokens 8192 --memory 1GiB --layer-order halves \
             --query-group 2 --schedule memory --attention triton --repeats 3 ;;
    pair128k) stage pair128k 300 python3 bench/run.py llama --tokens 131072 --budgets 2 16 --layer-order halves --query-group 8 --repeats 1 \
             --systems turnip-nondet floor --json "$OUT/pair128k.json" ;;
    smallest) stage smallest128k 200 python3 bench/run.py llama --tokens 131072 --budgets 1 --layer-order halves --query-group 8 --repeats 1 \
             --systems turnip-nondet floor --json "$OUT/smallest128k.json"
             stage smallest32k 120 python3 bench/run.py llama --tokens 32768 --budgets 0.5 --layer-order halves --repeats 1 \
             --systems turnip-nondet floor --json "$OUT/smallest32k.json" ;;
    tight128k) stage tight128k 200 python3 bench/run.py llama --tokens 131072 --budgets 2 --layer-order halves --query-group 8 --repeats 1 \
             --systems turnip-nondet floor --json "$OUT/tight128k.json"
           stage loose128k 200 python3 bench/run.py llama --tokens 131072 --budgets 16 --repeats 1 --systems turnip-nondet floor \
             --json "$OUT/loose128k.json" ;;
    generation) stage generation 480 python3 bench/bench_generation.py --time-limit 390 --json "$OUT/generation.json" ;;
    generationquick) stage generationquick 240 python3 bench/bench_generation.py --quick --device cuda --time-limit 170 \
             --json "$OUT/generationquick.json" ;;
    bf16) stage bf16tests 75 python3 -m pytest -m gpu -q -s -p no:cacheprovider -rfE --timeout 75 tests/test_cuda_bf16.py
             stage bf16bench 105 python3 bench/run.py llama --tokens 8192 --budgets 2 --repeats 3 --dtype bfloat16 float16 \
             --systems turnip-nondet floor --json "$OUT/bf16.json" ;;
    traintests) stage traintests 420 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 300 tests/test_cuda_train_gpu.py ;;
    train) stage train 570 python3 bench/bench_train.py --sections kernels train --time-limit 480 --json "$OUT/train.json" ;;
    train4k) stage train4k 400 python3 bench/bench_train.py --seq-lens 4096 --time-limit 330 --json "$OUT/train4k.json" ;;
    train16k) stage train16k 560 python3 bench/bench_train.py --seq-lens 16384 --time-limit 470 --json "$OUT/train16k.json" ;;
  esac
done
