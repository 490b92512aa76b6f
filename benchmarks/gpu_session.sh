#!/usr/bin/env bash
# The one batched GPU session that produced benchmarks/results/*-H200-*.json (run through the
# device tool on one H200; see README "Benchmarks"). Each part has its own time limit so one slow
# part cannot starve the rest; JSON results land in OUTDIR, logs in OUTDIR/../logs.
#   bash benchmarks/gpu_session.sh OUTDIR [part ...]   (parts: see the case list below; default all)
set -uo pipefail
out=${1:?usage: gpu_session.sh OUTDIR [parts...]}; shift
parts=${*:-check mmchain dense-sweep csr-strategies gmm gmm-bf16 gmm-sweep kmeans kmeans-sweep e2e streaming cuda-tests solver-ops profile profile-gmm distributed}
log=${LOGDIR:-/tmp/fusedml-logs}; mkdir -p "$out" "$log"
export PYTHONUNBUFFERED=1
run() {  # name seconds command...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" >"$log/$name.log" 2>&1
  local rc=$?
  { echo "#### $name rc=$rc"; cat "$log/$name.log"; } >> "$out/logs.txt"
  echo "== $name rc=$rc $((SECONDS - t0))s"
}
tile_timings() {  # sessions 34-35: the k-means table with and without weights, the weighted tl.dot sweep (forced
                 # tiles), the full-covariance single-sweep tiles (configs 14, 26, 23); JSON names end in _$1
  run kmeans 120 python3 benchmarks/bench_kmeans.py --out "$out/kmeans_$1.json"
  grep -E "^\| [0-9]" "$log/kmeans.log" | cut -c1-200
  run kmeans-w 120 python3 benchmarks/bench_kmeans.py --weights --out "$out/kmeans_weighted_$1.json"
  grep -E "^\| [0-9]" "$log/kmeans-w.log" | cut -c1-200
  run kmeans-wsweep 150 python3 benchmarks/bench_kmeans.py --sweep --sweep-cases 1,4,5 --sweep-dot-only --weights \
    --sweep-budget 30 --out "$out/kmeans_sweep_weighted_$1.json"
  grep -E "best_ms" "$log/kmeans-wsweep.log" | cut -c1-400
  run full-sweep 200 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 14,26,23 --sweep-precisions fp32 \
    --variants '^single BN=' --budget 90 --out "$out/gmm_full_sweep_$1.json"
  grep -E "^\| [0-9]" "$log/full-sweep.log" | cut -c1-200
}
gmm_fit_ab() {  # the GMM fit of .ab-base against this code, 5 fits each (FIT_SIDES: "base new", "new", "none")
  local side root
  for side in ${FIT_SIDES:-base new}; do
    [ "$side" = none ] && break
    root=.; [ $side = base ] && root=.ab-base
    run gmm-fit-$side 100 python3 $root/benchmarks/bench_end_to_end.py --parts gmm --repeat 5 --backends fused \
      --no-plots --out "$out/end_to_end_gmm_ab_$side.json"
    grep -E "^\| synthetic" "$log/gmm-fit-$side.log" | cut -d"|" -f2-6
  done
}
fuzz_cuda() {  # seconds cases-per-operator seed: a fuzz campaign on the GPU's compiled kernels (0 cases: none)
  [ "$2" -gt 0 ] || return 0
  run fuzz "$1" python3 tests/fuzz.py --device cuda --n "$2" --seed "$3"
  grep -E "^FAIL|cases passed" "$log/fuzz.log" | cut -c1-400 | tail -8
}
check_mm() {  # tag [seconds]: check_gpu.py of mmchain and loss_gradient on compiled kernels against float64
  run check "${2:-300}" python3 benchmarks/check_gpu.py --parts mmchain loss_gradient --out "$out/check_gpu_$1.json"
  grep -E "^FAIL|passed" "$log/check.log" | tail -8
}
solver_ops() {  # tag NxDxm...: bench_solver_ops.py at these shapes, its table's rows
  local tag=$1; shift
  run solver-ops 150 python3 benchmarks/bench_solver_ops.py --shapes "$@" --out "$out/solver_ops_$tag.json"
  grep -E "^\| [0-9]" "$log/solver-ops.log" | cut -c1-200
}
trace_fits() {  # tag algo...: profile_fit's traces of the 2M x 256 fits, their GPU gaps (into logs.txt), the traces packed
  local tag=$1 a algos=(); shift
  for a in "$@"; do algos+=(--algo "$a"); done
  run trace 200 python3 benchmarks/profile_fit.py --shape 2000000x256 "${algos[@]}" \
    --trace-dir "$out/traces" --out "$out/profile_fit_$tag.json"
  grep -E "^\| 2000000" "$log/trace.log" | cut -c1-200
  python3 benchmarks/trace_gaps.py "$out"/traces/trace-*-fused.json --top 16 > "$log/gaps.log" 2>&1
  cat "$log/gaps.log"; { echo "#### gaps"; cat "$log/gaps.log"; } >> "$out/logs.txt"
  tar -C "$out" -czf "$out/traces.tar.gz" traces && rm -rf "$out/traces"
}
hessian_probe() {  # log seconds out-tag hessian_probe.py arguments...: the probe, its table's rows
  local name=$1 secs=$2 tag=$3; shift 3
  run "$name" "$secs" python3 benchmarks/hessian_probe.py "$@" --out "$out/hessian_probe_$tag.json"
  grep -E "^\| (softmax|xtv|mul|loss|plain)" "$log/$name.log" | cut -c1-200
}
check_counts() {  # log name: a probe's float64 checks passed / failed (its table's ok column)
  echo "checks ok: $(grep -c "| True |" "$log/$1.log"), failed: $(grep -c "| False |" "$log/$1.log")"
}
fits_ab() {  # fits-a-side: the dense linear fits (1M x 100, 2M x 256, both backends) of .ab-base against this code,
           # interleaved base / new / base / new
  local r side root
  for r in 1 2; do
    for side in base new; do
      root=.; [ $side = base ] && root=.ab-base
      run e2e-$side-$r 300 python3 $root/benchmarks/bench_end_to_end.py --parts dense large --large 2000000x256 \
        --algorithms logistic linearsvc poisson ridge --repeat "$1" --backends fused ops --no-plots \
        --out "$out/end_to_end_ab${1}_${side}_$r.json"
      grep -E "^\| synthetic" "$log/e2e-$side-$r.log" | cut -d"|" -f2-4,10 | tail -16
    done
  done
}
for p in $parts; do
  case $p in
    check) run check 150 python3 benchmarks/check_gpu.py --out "$out/check_gpu.json"
           grep -E "^FAIL|passed" "$log/check.log" | tail -12 ;;
    check-kmeans) run check-kmeans 60 python3 benchmarks/check_gpu.py --parts kmeans --out "$out/check_gpu_kmeans.json" ;;
    mmchain) run mmchain 60 python3 benchmarks/bench_mmchain.py --max-csr-sweep 3 --out "$out/mmchain.json" ;;
    dense-sweep) run dense-sweep 60 python3 benchmarks/bench_mmchain.py --dense-sweep --out "$out/mmchain-dense-sweep.json" ;;
    csr-strategies) run csr-strategies 70 python3 benchmarks/bench_mmchain.py --csr-strategies --out "$out/mmchain-csr-strategies.json" ;;
    gmm) run gmm 60 python3 benchmarks/bench_gmm.py --out "$out/gmm.json" ;;
    gmm-sweep) run gmm-sweep 50 python3 benchmarks/bench_gmm.py --sweep --budget 30 --out "$out/gmm-sweep.json" ;;
    gmm-reg)  # session 19: the register-FMA single sweep beside the tl.dot plans it replaced
      run check-gmm 240 python3 benchmarks/check_gpu.py --parts gmm --out "$out/check_gpu_gmm.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -12
      run gmm-reg 150 python3 benchmarks/bench_gmm.py --configs 1,2,0,3,16,17,18,19,4,5,6,7 --out "$out/gmm.json" ;;
    gmm-host)  # session 20: parameters prepared on the host; the CUDA tests, the check, the E-step
               # table (ms_call / ms_call_host: the public call with GPU / host parameters), the GMM fit
      run cuda-tests-gmm 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py
      tail -3 "$log/cuda-tests-gmm.log"
      run check-gmm 240 python3 benchmarks/check_gpu.py --parts gmm --out "$out/check_gpu_gmm.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -12
      run gmm-host 170 python3 benchmarks/bench_gmm.py --configs 1,2,0,3,16,17,18,19,4,5,6,7 --out "$out/gmm.json"
      run e2e-gmm 150 python3 benchmarks/bench_end_to_end.py --parts gmm --repeat 3 --sklearn-budget 5 \
        --out "$out/end_to_end_gmm.json"
      run gmm-host-probe 120 python3 benchmarks/gmm_host_probe.py --out "$out/gmm_host_probe.json"
      tail -8 "$log/gmm-host-probe.log" ;;
    gmm-sph)  # session 20: spherical register tiles; the check, the spherical rows beside diag ones
      run cuda-tests-gmm 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py
      tail -1 "$log/cuda-tests-gmm.log"
      run check-gmm 240 python3 benchmarks/check_gpu.py --parts gmm --out "$out/check_gpu_gmm.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -12
      run gmm-sph 120 python3 benchmarks/bench_gmm.py --configs 17,20,21,10,1,19 --out "$out/gmm.json" ;;
    kmeans-reg)  # session 20: the Lloyd step in the register form; its check, table, the GMM fit it initialises
      run check-kmeans 90 python3 benchmarks/check_gpu.py --parts kmeans --out "$out/check_gpu_kmeans.json"
      grep -E "^FAIL|passed" "$log/check-kmeans.log" | tail -6
      run kmeans 90 python3 benchmarks/bench_kmeans.py --out "$out/kmeans.json"
      run e2e-gmm 150 python3 benchmarks/bench_end_to_end.py --parts gmm --repeat 3 --sklearn-budget 5 \
        --out "$out/end_to_end_gmm.json"
      run gmm-fit-probe 90 python3 benchmarks/gmm_host_probe.py --shapes 1048576x16x16 --out "$out/gmm_host_probe.json"
      grep -A1 "phases" "$log/gmm-fit-probe.log" | head -2 ;;
    gmm-reg-sweep)  # its launch probe: components / rows per thread, blocks ahead; tl.dot blocks
      run gmm-reg-sweep 330 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 1,2,3,16,17,18,19 \
        --sweep-precisions fp32 --budget 270 --out "$out/gmm-sweep.json"
      run gmm-dot-sweep 300 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 3,17,4,6,7,1 \
        --sweep-precisions fp32 --budget 240 --variants '^single (BN=|tl.dot plan|occ$)' --out "$out/gmm-sweep-dot.json" ;;
    gmm-bf16) run gmm-bf16 60 python3 benchmarks/bench_gmm.py --precision bf16 --out "$out/gmm-bf16.json" ;;
    ncu-gmm)  # Nsight Compute on the single sweep and the two-pass kernels (one launch each)
      ncu_sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
      ncu_sec="$ncu_sec --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
      ncu_sec="$ncu_sec --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
      run ncu-gmm-16 120 ncu $ncu_sec --kernel-name "regex:_diag_(single|reg)" --launch-skip 1 --launch-count 1 \
        python3 benchmarks/ncu_gmm.py --shape 4194304,16,16
      run ncu-gmm-8 120 ncu $ncu_sec --kernel-name "regex:_diag_(single|reg)" --launch-skip 1 --launch-count 1 \
        python3 benchmarks/ncu_gmm.py --shape 16777216,8,8
      run ncu-gmm-1024 120 ncu $ncu_sec --kernel-name "regex:_diag_(lse|stats)" --launch-skip 2 --launch-count 2 \
        python3 benchmarks/ncu_gmm.py --shape 1048576,128,1024 --precision bf16 ;;
    ncu-mm)  # Nsight Compute on the dense small-m (m = 4) and bf16 m = 1 mmchain kernels (one launch each)
      ncu_sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
      ncu_sec="$ncu_sec --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
      ncu_sec="$ncu_sec --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
      run ncu-mm-m4 60 ncu $ncu_sec --kernel-name regex:_mmchain_small --launch-skip 1 --launch-count 1 \
        python3 benchmarks/ncu_mmchain.py --shape 2000000,128,4
      run ncu-mm-bf16 60 ncu $ncu_sec --kernel-name regex:_mmchain_onchip --launch-skip 1 --launch-count 1 \
        python3 benchmarks/ncu_mmchain.py --shape 2000000,128,1 --dtype bfloat16 ;;
    ncu-mm-d128)  # session 24: why rows of 128 values run below the other m = 1 shapes (fp32 2M x 128 at 90 %,
                  # bf16 at 84-86 %, against 95-97 % at D = 32, 512, 2048): the same sections for the three
      ncu_sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
      ncu_sec="$ncu_sec --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
      ncu_sec="$ncu_sec --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
      for c in 2000000,128,1:bfloat16 2000000,128,1:float32 125000,2048,1:float32; do
        run ncu-d128-${c%%:*}-${c##*:} 70 ncu $ncu_sec --kernel-name regex:_mmchain_onchip --launch-skip 1 \
          --launch-count 1 python3 benchmarks/ncu_mmchain.py --shape ${c%%:*} --dtype ${c##*:}
        grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Theoretical Occ|Block Size|Grid Size" \
          "$log/ncu-d128-${c%%:*}-${c##*:}.log" | head -12
      done ;;
    kmeans) run kmeans 40 python3 benchmarks/bench_kmeans.py --out "$out/kmeans.json" ;;
    kmeans-sweep) run kmeans-sweep 45 python3 benchmarks/bench_kmeans.py --sweep --out "$out/kmeans-sweep.json" ;;
    gmm-em)  # session 21: the device EM loop (graphs, one iteration ahead) on 50-iteration fits (with kmeans-reg)
      run check-gmm-em 120 python3 benchmarks/check_gpu.py --parts gmm_em --out "$out/check_gpu_gmm_em.json"
      grep -E "^FAIL|passed" "$log/check-gmm-em.log" | tail -6
      run e2e-gmm-long 200 python3 benchmarks/bench_end_to_end.py --parts gmm --max-iter 50 --tol 0 --repeat 3 \
        --sklearn-budget 5 --out "$out/end_to_end_gmm_long.json"
      run e2e-gmm-long-hostloop 120 env FUSEDML_DEVICE_EM=0 python3 benchmarks/bench_end_to_end.py --parts gmm \
        --max-iter 50 --tol 0 --repeat 3 --backends fused --no-plots --out "$out/end_to_end_gmm_long_hostloop.json"
      run e2e-gmm-nographs 120 env FUSEDML_CUDA_GRAPHS=0 python3 benchmarks/bench_end_to_end.py --parts gmm \
        --repeat 3 --backends fused --no-plots --out "$out/end_to_end_gmm_nographs.json"
      ;;
    kmeans-sweep-dot)  # session 21: the tl.dot form's BLOCK_N / warps where the register form does not apply
      run kmeans-sweep-dot 120 python3 benchmarks/bench_kmeans.py --sweep --sweep-cases 1,4,5 --sweep-dot-only \
        --sweep-budget 30 --out "$out/kmeans-sweep-dot.json" ;;
    e2e) run e2e 200 python3 benchmarks/bench_end_to_end.py --repeat 1 --sklearn-budget 5 --out "$out/end_to_end.json" ;;
    e2e-gmm) run e2e-gmm 120 python3 benchmarks/bench_end_to_end.py --parts gmm --repeat 3 --sklearn-budget 5 \
               --out "$out/end_to_end_gmm.json" ;;
    e2e-dense) run e2e-dense 300 python3 benchmarks/bench_end_to_end.py --parts dense large --repeat 3 \
                 --sklearn-budget 5 --out "$out/end_to_end_dense.json" ;;
    e2e-multinomial) run e2e-multinomial 200 python3 benchmarks/bench_end_to_end.py --parts dense large \
                       --algorithms logistic-multinomial --repeat 3 --sklearn-budget 5 --out "$out/end_to_end_multinomial.json" ;;
    e2e-mult-ab)  # the multinomial fits with the one-read loss pass (m <= 16) against matvec + X^T V
      for mm in 16 1; do
        run e2e-mult-ab-$mm 150 env FUSEDML_LOSS_ONE_READ_M=$mm python3 benchmarks/bench_end_to_end.py \
          --parts dense large --algorithms logistic-multinomial --backends fused ops --repeat 3 --no-plots \
          --out "$out/end_to_end_multinomial_lossm$mm.json"
      done ;;
    solver-ops-m3) run solver-ops-m3 150 python3 benchmarks/bench_solver_ops.py \
                     --shapes 1000000x100x3 4000000x64x3 16000000x64x3 --out "$out/solver_ops_m3.json" ;;
    solver-ops-m5) run solver-ops-m5 200 python3 benchmarks/bench_solver_ops.py \
                     --shapes 1000000x100x5 4000000x64x5 16000000x64x5 2000000x256x5 2000000x256x3 \
                     --out "$out/solver_ops_m5.json" ;;
    solver-ops-m3-sweep) run solver-ops-m3-sweep 300 python3 benchmarks/bench_solver_ops.py --sweep-precision \
                           --shapes 1000000x100x3 4000000x64x3 16000000x64x3 --out "$out/solver_ops_m3_sweep.json" ;;
    e2e-mult3) run e2e-mult3 200 python3 benchmarks/bench_end_to_end.py --parts dense large --classes 3 \
                 --algorithms logistic-multinomial --backends fused ops --repeat 3 --no-plots \
                 --out "$out/end_to_end_multinomial3.json" ;;
    m3-probe) run m3-probe 300 python3 benchmarks/m3_probe.py --out "$out/m3_probe.json" ;;
    m5-probe) run m5-probe 300 python3 benchmarks/m3_probe.py --m 5 --shapes 16000000x64 4000000x64 1000000x100 \
                --out "$out/m5_probe.json" ;;
    m58-probe) run m58-softmax 200 python3 benchmarks/m3_probe.py --m 8 --shapes 4000000x64 1000000x100 \
                 --launches 4x8 8x4 --forms softmax loss --out "$out/m8_probe.json"
               run m5-wide 200 python3 benchmarks/m3_probe.py --m 5 --shapes 2000000x256 --launches 4x8 8x4 4x4 \
                 --forms softmax loss --loss-max-d 256 --out "$out/m5_wide_probe.json"
               run m3-wide-loss 200 python3 benchmarks/m3_probe.py --m 3 --shapes 2000000x256 \
                 --launches 4x8 8x4 4x4 --forms loss --loss-max-d 256 --out "$out/m3_wide_loss_probe.json" ;;
    m58-probe2) run m5-wide-loss 200 python3 benchmarks/m3_probe.py --m 5 --shapes 2000000x256 --launches 4x8 8x4 \
                  --forms loss --loss-max-d 256 --out "$out/m5_wide_loss_probe.json"
                run m6-probe 200 python3 benchmarks/m3_probe.py --m 6 --shapes 4000000x64 --launches 4x8 8x4 \
                  --forms softmax loss --out "$out/m6_probe.json"
                run m8-wide 200 python3 benchmarks/m3_probe.py --m 8 --shapes 2000000x256 --launches 4x8 8x4 \
                  --forms softmax --out "$out/m8_wide_probe.json" ;;
    chunk-probe)  # column-chunked tiles of the unrolled kernel (session 18)
      run chunk-plain 120 python3 benchmarks/m3_probe.py --shapes 2000000x128x4p \
        --launches 8x8c64p1 8x8c64p2 16x8c64p1 8x16c32p1 4x16c32p1 --out "$out/chunk_plain.json"
      run chunk-m3-64 200 python3 benchmarks/m3_probe.py --m 3 --shapes 16000000x64 4000000x64 --forms softmax loss \
        --launches 8x8c32 4x8c32 8x8c16 4x16c16 8x16c32 --out "$out/chunk_m3_64.json"
      run chunk-m3-100 120 python3 benchmarks/m3_probe.py --m 3 --shapes 1000000x100 --forms softmax loss \
        --launches 8x8c64 4x8c64 8x16c32 4x16c32 --out "$out/chunk_m3_100.json"
      run chunk-m5-64 200 python3 benchmarks/m3_probe.py --m 5 --shapes 16000000x64 4000000x64 --forms softmax loss \
        --launches 4x8c32 8x8c32 4x16c16 --out "$out/chunk_m5_64.json"
      run chunk-m5-100 120 python3 benchmarks/m3_probe.py --m 5 --shapes 1000000x100 --forms softmax loss \
        --launches 4x8c64 8x8c64 4x16c32 --out "$out/chunk_m5_100.json" ;;
    profile-mult) run profile-mult 150 python3 benchmarks/profile_fit.py --shape 16000000x64 --shape 1000000x100 \
                    --algo multinomial --out "$out/profile_fit_mult.json" ;;
    e2e-mult) run e2e-mult 200 python3 benchmarks/bench_end_to_end.py --parts dense large \
                --algorithms logistic-multinomial --backends fused ops --repeat 3 --no-plots \
                --out "$out/end_to_end_multinomial.json" ;;
    e2e3) run e2e3 420 python3 benchmarks/bench_end_to_end.py --repeat 3 --sklearn-budget 5 --out "$out/end_to_end.json" ;;
    streaming) run streaming 60 python3 benchmarks/bench_streaming.py --scale 0.5 --reps 3 --out "$out/streaming.json" ;;
    cuda-tests) run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_streaming.py \
                  tests/test_algorithms_base.py tests/test_gmm.py tests/test_algorithms_mixture.py
                tail -1 "$log/cuda-tests.log" | cut -c1-300 ;;
    solver-ops) run solver-ops 240 python3 benchmarks/bench_solver_ops.py --sweep --out "$out/solver_ops.json" ;;
    solver-ops-prec) run solver-ops-prec 240 python3 benchmarks/bench_solver_ops.py --sweep-precision \
                       --shapes 1000000x100x3 2000000x128x4 --out "$out/solver_ops_prec.json" ;;
    solver-ops-wide) run solver-ops-wide 200 python3 benchmarks/bench_solver_ops.py --sweep-precision \
                       --shapes 2000000x256x3 1000000x100x3 --out "$out/solver_ops_wide.json" ;;
    solver-ops-m5) run solver-ops-m5 150 python3 benchmarks/bench_solver_ops.py --shapes 2000000x256x5 2000000x256x3 \
                     --out "$out/solver_ops_m5.json" ;;
    e2e-mult-wide) run e2e-mult-wide 200 python3 benchmarks/bench_end_to_end.py --parts large --large 2000000x256 \
                     --algorithms logistic-multinomial --repeat 3 --sklearn-budget 1 --no-plots \
                     --out "$out/end_to_end_multinomial_2Mx256.json" ;;
    solver-ops-m1) run solver-ops-m1 200 python3 benchmarks/bench_solver_ops.py --sweep \
                     --shapes 1000000x100 2000000x256 4000000x64 --out "$out/solver_ops_m1.json" ;;
    solver-ops-table) run solver-ops-table 90 python3 benchmarks/bench_solver_ops.py --out "$out/solver_ops.json" ;;
    csr-tiles) run csr-tiles 240 python3 benchmarks/bench_csr_tiles.py --out "$out/csr_tiles.json" ;;
    e2e-csr) run e2e-csr 240 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 2 \
               --no-plots --out "$out/end_to_end_csr.json" ;;
    stream-probe) run stream-probe 90 python3 benchmarks/stream_probe.py --out "$out/stream_probe.json" ;;
    strips-probe) run strips-probe 60 python3 benchmarks/strips_probe.py --out "$out/strips_probe.json" ;;
    softmax-probe) run softmax-probe 120 python3 benchmarks/launch_probe.py --probe softmax --out "$out/softmax_probe.json" ;;
    dot-probe) run dot-probe 300 python3 benchmarks/launch_probe.py --probe dot --out "$out/dot_probe.json" ;;
    grid-probe) run grid-probe 500 python3 benchmarks/launch_probe.py --probe grid --out "$out/grid_probe.json" ;;
    tiles-probe) run tiles-probe 90 python3 benchmarks/launch_probe.py --probe tiles --out "$out/tiles_probe.json" ;;
    gather-probe) run gather-probe 120 python3 benchmarks/gather_probe.py --out "$out/gather_probe.json" ;;
    host-overhead) run host-overhead 90 python3 benchmarks/host_overhead.py --out "$out/host_overhead.json" ;;
    check-cg) run check-cg 60 python3 benchmarks/check_gpu.py --parts cg --out "$out/check_gpu_cg.json"
              grep -E "^FAIL|passed" "$log/check-cg.log" | tail -4 ;;
    cg-ab) run cg-ab 240 python3 benchmarks/host_overhead.py --ab-only --ab-var FUSEDML_FUSED_CG \
             --ab-algos logistic multinomial linearsvc poisson ridge --ab-shapes 1000000x100 4000000x64 \
             --out "$out/cg_ab.json" ;;
    lag-ab) run lag-ab 240 python3 benchmarks/host_overhead.py --ab-only --ab-var FUSEDML_CG_LAG --ab-values 0 1 \
              --ab-reps 5 --ab-algos logistic multinomial ridge --out "$out/lag_ab.json" ;;
    bind-ab) run bind-ab 300 python3 benchmarks/host_overhead.py --ab-only --ab-var FUSEDML_BIND --ab-values 1 0 \
               --ab-reps 7 --ab-algos logistic multinomial linearsvc poisson ridge \
               --ab-shapes 1000000x100 4000000x64 --out "$out/bind_ab.json" ;;
    capture-ab) run capture-ab 300 python3 benchmarks/host_overhead.py --ab-only --ab-var FUSEDML_CAPTURE_AFTER \
                  --ab-values 16 4 2 --ab-algos logistic multinomial linearsvc poisson ridge \
                  --ab-shapes 1000000x100 4000000x64 --out "$out/capture_ab.json" ;;
    check-mm) run check-mm 120 python3 benchmarks/check_gpu.py --parts mmchain loss_gradient --out "$out/check_gpu_mm.json"
              grep -E "^FAIL|passed" "$log/check-mm.log" | tail -12 ;;
    profile) run profile 150 python3 benchmarks/profile_fit.py --shape 1000000x100 --shape 2000000x256 \
               --algo logistic --algo linearsvc --cprofile 30 --out "$out/profile_fit.json" ;;
    trace)  # session 22: Chrome traces of whole fits (plain and with Python stacks) for their GPU idle gaps
      run trace 240 python3 benchmarks/profile_fit.py --shape 1000000x100 --shape 4000000x64 --algo logistic \
        --algo linearsvc --algo poisson --cprofile 40 --trace-dir "$out/traces" --trace-stacks --out "$out/profile_fit.json"
      tar -C "$out" -czf "$out/traces.tar.gz" traces && rm -rf "$out/traces" ;;
    gmm-regcap)  # session 23: the register form's Horner product sum and hardware log2 / reciprocal against
                 # .ab-base (an earlier commit's checkout), model picks interleaved base / new / base / new,
                 # then its register caps and rows per thread
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run gmm-ab-$side-$r 90 python3 $root/benchmarks/bench_gmm.py --sweep --no-targets --configs 1,2,19,18 \
            --variants '^$' --sweep-precisions fp32 --out "$out/gmm_ab_${side}_$r.json"
          grep -E "^\| [0-9]" "$log/gmm-ab-$side-$r.log"
        done
      done
      run gmm-regsweep 240 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 1,2,19,18,20,17 \
        --variants '^single reg' --sweep-precisions fp32 --budget 150 --out "$out/gmm_regsweep.json"
      grep -E "^\| [0-9]" "$log/gmm-regsweep.log" ;;
    gmm-regcap2)  # session 23: the register cap decided at the first launch (register_cap) against .ab-base,
                  # model picks, one round each; the cap / warps / blocks-ahead sweep
      for side in base new; do
        root=.; [ $side = base ] && root=.ab-base
        run gmm-ab2-$side 90 python3 $root/benchmarks/bench_gmm.py --sweep --no-targets --configs 1,2,19,18,20,21,17 \
          --variants '^$' --sweep-precisions fp32 --out "$out/gmm_ab2_${side}.json"
        grep -E "^\| [0-9]" "$log/gmm-ab2-$side.log"
      done
      run gmm-regsweep2 200 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 1,2,19 \
        --variants 'maxnreg' --sweep-precisions fp32 --budget 120 --out "$out/gmm_regsweep2.json"
      grep -E "^\| [0-9]" "$log/gmm-regsweep2.log" ;;
    gmm-regcap3)  # session 23: int32 row offsets and no feature-mask select in the register form: model picks
                  # of .ab-base, .ab-mid (earlier checkouts) and this code; Nsight Compute's stall reasons on
                  # 4M x 16, K = 16; the GMM and k-means checks against float64
      for side in base mid new; do
        root=.; [ $side = base ] && root=.ab-base; [ $side = mid ] && root=.ab-mid
        run gmm-ab3-$side 90 python3 $root/benchmarks/bench_gmm.py --sweep --no-targets --configs 1,2,19,18,20,21,17 \
          --variants '^$' --sweep-precisions fp32 --out "$out/gmm_ab3_${side}.json"
        grep -E "^\| [0-9]" "$log/gmm-ab3-$side.log"
      done
      ncu_sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
      ncu_sec="$ncu_sec --section ComputeWorkloadAnalysis --section InstructionStats"
      run ncu-reg-16 120 ncu $ncu_sec --kernel-name "regex:_diag_reg" --launch-skip 1 --launch-count 1 \
        python3 benchmarks/ncu_gmm.py --shape 4194304,16,16
      grep -E "Stall|stall|Warp Cycles|Issued|Eligible|Active Warps|Registers|Theoretical Occ|Achieved Occ|Duration|Executed Ipc" \
        "$log/ncu-reg-16.log" | head -40
      run check-gmm 200 python3 benchmarks/check_gpu.py --parts gmm kmeans --out "$out/check_gpu_gmm.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -4 ;;
    gmm-final)  # session 23: the final code's CUDA tests (GMM, mixture, k-means), the E-step table (diag and
                # spherical rows in one run), the k-means table and the GMM fit
      run cuda-tests-gmm 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py tests/test_kmeans.py
      tail -1 "$log/cuda-tests-gmm.log"
      run gmm-final 200 python3 benchmarks/bench_gmm.py --configs 1,2,0,3,16,17,18,19,4,5,6,7,20,21,10 \
        --out "$out/gmm.json"
      grep -E "^\| [0-9]" "$log/gmm-final.log" | cut -d"|" -f2-12
      run kmeans 90 python3 benchmarks/bench_kmeans.py --out "$out/kmeans.json"
      grep -E "^\| [0-9]" "$log/kmeans.log" | cut -d"|" -f2-9
      run e2e-gmm 150 python3 benchmarks/bench_end_to_end.py --parts gmm --repeat 3 --sklearn-budget 5 \
        --out "$out/end_to_end_gmm.json"
      grep -E "^\| " "$log/e2e-gmm.log" | tail -4 ;;
    gmm-one-launch)  # session 24: the register form's one-launch E-step (last program finishes): its GPU check,
                     # the host-bound 1M-row passes of .ab-base (session start) and this code interleaved, the
                     # host probe (the data pass's profile, this host's primitives)
      run check-gmm 200 python3 benchmarks/check_gpu.py --parts gmm --out "$out/check_gpu_gmm.json"
      grep -E "^FAIL|one-launch|passed" "$log/check-gmm.log" | tail -16
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run gmm-ol-$side-$r 45 python3 $root/benchmarks/bench_gmm.py --sweep --no-targets --configs 0,18,19 \
            --variants '^$' --sweep-precisions fp32 --out "$out/gmm_ol_ab_${side}_$r.json"
          grep -E "^\| [0-9]" "$log/gmm-ol-$side-$r.log" | cut -d"|" -f2-8
        done
      done
      run gmm-host-probe 60 python3 benchmarks/gmm_host_probe.py --shapes 1048576x2x2 1048576x16x16 --fit '' \
        --out "$out/gmm_host_probe.json"
      grep "^== " "$log/gmm-host-probe.log" ;;
    gmm-s24-final)  # session 24: the final code's GMM check, E-step table (the README's), A/B rounds, host probe
      run check-gmm 200 python3 benchmarks/check_gpu.py --parts gmm --out "$out/check_gpu_gmm.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -4
      run gmm-final 240 python3 benchmarks/bench_gmm.py --configs 1,2,0,3,16,17,18,19,4,5,6,7,20,21,10 \
        --out "$out/gmm.json"
      grep -E "^\| [0-9]" "$log/gmm-final.log" | cut -d"|" -f2-12
      for r in 1 2 3; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run gmm-ol-$side-$r 45 python3 $root/benchmarks/bench_gmm.py --sweep --no-targets --configs 0 \
            --variants '^$' --sweep-precisions fp32 --out "/tmp/gmm_ol_ab_${side}_$r.json"
          grep -E "^\| [0-9]" "$log/gmm-ol-$side-$r.log" | cut -d"|" -f2-8
        done
      done
      tar -C /tmp -cf "$out/gmm_ol_ab.tar" $(cd /tmp && ls gmm_ol_ab_*.json)
      run gmm-host-probe 60 python3 benchmarks/gmm_host_probe.py --shapes 1048576x2x2 1048576x16x16 --fit '' \
        --out "$out/gmm_host_probe.json"
      grep "^== " "$log/gmm-host-probe.log" ;;
    x-evict-ab)  # session 24: X's loads evict-first (default) against the default L2 policy (FUSEDML_X_EVICTION=""),
                 # interleaved: the dense mmchain cases twice, the solvers' passes once; the check on the new default
      run check-mm 150 python3 benchmarks/check_gpu.py --parts mmchain loss_gradient --out "$out/check_gpu_mm.json"
      grep -E "^FAIL|passed" "$log/check-mm.log" | tail -4
      dense=dense-8Mx32,dense-2Mx128,dense-500kx512,dense-125kx2048,dense-16kx16384,dense-4kx65536,dense-2Mx128-bf16,dense-2Mx128-m4
      for r in 1 2; do
        for side in base new; do
          ev=evict_first; [ $side = base ] && ev=
          run mm-ev-$side-$r 60 env FUSEDML_X_EVICTION=$ev python3 benchmarks/bench_mmchain.py --cases $dense --no-sweep \
            --out "$out/mmchain_ev_${side}_$r.json"
          grep -E "^\| dense" "$log/mm-ev-$side-$r.log" | cut -d"|" -f2-8
        done
      done
      for side in base new; do
        ev=evict_first; [ $side = base ] && ev=
        run solver-ev-$side 90 env FUSEDML_X_EVICTION=$ev python3 benchmarks/bench_solver_ops.py \
          --out "$out/solver_ops_ev_$side.json"
        grep -E "^\| [0-9]" "$log/solver-ev-$side.log" | cut -d"|" -f2-7
      done ;;
    fuzz)  # session 25: tests/fuzz.py on the compiled kernels (fresh seeds; the failing cases' seeds in the log)
      fuzz_cuda 280 "${FUZZ_N:-120}" "${FUZZ_SEED:-$RANDOM}" ;;
    s25-ab)  # session 25 (no GPU that session): the CSR passes' 1-D gather / scatter (Triton 3.6 had a layout
             # change with 4-6 bar.sync per loop step) and GMM pass 1's 16-row tiles at 4M x 256, K = 16 (3.6
             # spilled in the loop), .ab-base (a checkout of session 24's final code) against this code, interleaved
      run check-s25 200 python3 benchmarks/check_gpu.py --parts mmchain gmm --out "$out/check_gpu_s25.json"
      tail -2 "$log/check-s25.log"
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run csr-$side-$r 150 python3 $root/benchmarks/bench_mmchain.py --cases csr-4Mx100k,csr-1Mx1M,csr-powerlaw \
            --no-sweep --out "$out/mmchain_csr_${side}_$r.json"
          grep -E "^\| csr" "$log/csr-$side-$r.log" | cut -c1-150
          run gmm256-$side-$r 150 python3 $root/benchmarks/bench_gmm.py --configs 7 --out "$out/gmm256_${side}_$r.json"
          grep -E "^\| 4,194,304 x 256" "$log/gmm256-$side-$r.log" | cut -c1-200
        done
      done ;;
    s26-ab)  # session 26 (no GPU that session): CSR m > 1 with the rows of y / w / p padded to a power of two
             # (16-byte vector gathers, F32x4 REDs, no per-step layout change), .ab-base (git archive ee556fd, session
             # 25's final code; its bench script replaced by this one for the m > 1 cases) against this code, interleaved
      run check-s26 240 python3 benchmarks/check_gpu.py --parts mmchain loss_gradient --out "$out/check_gpu_s26.json"
      grep -E "^FAIL|passed" "$log/check-s26.log" | tail -6
      cp benchmarks/bench_mmchain.py .ab-base/benchmarks/bench_mmchain.py
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run csrm-$side-$r 200 python3 $root/benchmarks/bench_mmchain.py --no-sweep \
            --cases csr-4Mx100k-m3,csr-4Mx100k-m4,csr-4Mx100k-m5,csr-1Mx1M-m3,csr-4Mx100k --out "$out/mmchain_csrm_${side}_$r.json"
          grep -E "^\| csr" "$log/csrm-$side-$r.log" | cut -c1-150
        done
      done ;;
    s38b)  # session 38: the linear fits' X check read with the solver's start, the CG engine set up behind the start's
           # pass: .ab-base (git archive 8458736) against this code, interleaved base / new / base / new, both backends
      fits_ab 5 ;;
    s38g)  # session 38: a fuzz campaign of loss_gradient and whole fits on the GPU's compiled kernels (the terms kernel)
      run fuzz-lg 200 python3 tests/fuzz.py --device cuda --n 40 --seed 38100 --ops loss_gradient fit
      grep -E "^FAIL|cases passed" "$log/fuzz-lg.log" | cut -c1-400 | tail -8 ;;
    s38h)  # session 38, after s38g (loss_gradient:38103: the terms kernel's Tweedie power rounded to fp32, now an
           # fp32 pair): the case replayed, the campaign again
      run fuzz-replay 60 python3 tests/fuzz.py --device cuda --case loss_gradient:38103
      tail -1 "$log/fuzz-replay.log" | cut -c1-300
      run fuzz-lg 200 python3 tests/fuzz.py --device cuda --n 40 --seed 38100 --ops loss_gradient fit
      grep -E "^FAIL|cases passed" "$log/fuzz-lg.log" | cut -c1-400 | tail -8 ;;
    s38f)  # session 38: the two-read loss pass with its pointwise terms in one launch (wide rows for m, CSR), float64
           # checks, the pass at 2M x 256 m = 5, the 5-class fit at 2M x 256 and the CSR fits against .ab-base (f5036ac)
      run check 240 python3 benchmarks/check_gpu.py --parts loss_gradient --out "$out/check_gpu_s38f.json"
      grep -E "^FAIL|passed" "$log/check.log" | tail -8
      solver_ops s38f 2000000x256x5
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run e2e-$side-$r 300 python3 $root/benchmarks/bench_end_to_end.py --parts large csr --large 2000000x256 \
            --algorithms logistic-multinomial logistic poisson --repeat 5 --backends fused --no-plots \
            --out "$out/end_to_end_terms_${side}_$r.json"
          grep -E "^\| synthetic" "$log/e2e-$side-$r.log" | cut -d"|" -f2-4,10 | tail -6
        done
      done ;;
    s40|s41)  # session 40, on an H200 only (FUSEDML_ANY_GPU=1 to run elsewhere): the README's tables on the current
          # code, all on one GPU: the compiled kernels against float64 (s40; s41 leaves this to the part cuda-tests
          # before it) and the solvers' CUDA tests; mmchain with its sweep, the solver passes (m = 1, 3, 5), X^T V
          # m = 5 / 8 unrolled against the padded dot; the end-to-end tables (dense medians of 5, CSR and GMM
          # medians of 3 / 5)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
      if [[ "$gpu" != *H200* && "${FUSEDML_ANY_GPU:-0}" != 1 ]]; then echo "$p: $gpu is not an H200, skipped"; continue; fi
      if [ "$p" = s40 ]; then
        check_mm s40 200
        run cuda-solvers 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_algorithms_base.py
        tail -1 "$log/cuda-solvers.log" | cut -c1-300
      fi
      run mmchain 150 python3 benchmarks/bench_mmchain.py --max-csr-sweep 3 --out "$out/mmchain_s40.json"
      grep -E "^\| (dense|csr)" "$log/mmchain.log" | cut -c1-200
      solver_ops s40_m1 1000000x100 2000000x256 4000000x64
      solver_ops s40_m3 1000000x100x3 4000000x64x3 16000000x64x3 2000000x256x3 2000000x256x5
      hessian_probe probe-xtv 150 s40_xtv --cases xtv5 xtv8 xtv5-512 --only "padded dot"
      run e2e-dense 420 python3 benchmarks/bench_end_to_end.py --parts dense large --repeat 5 --sklearn-budget 5 \
        --no-plots --out "$out/end_to_end_dense_s40.json"
      grep -E "^\| synthetic" "$log/e2e-dense.log" | cut -c1-200
      run e2e-csr 240 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 2 --no-plots \
        --out "$out/end_to_end_csr_s40.json"
      grep -E "^\| synthetic" "$log/e2e-csr.log" | cut -c1-200
      run e2e-gmm 150 python3 benchmarks/bench_end_to_end.py --parts gmm --repeat 5 --sklearn-budget 5 --no-plots \
        --out "$out/end_to_end_gmm_s40.json"
      grep -E "^\| synthetic" "$log/e2e-gmm.log" | cut -c1-200 ;;
    s42)  # session 42: the GMM E-step and the Lloyd step at odd widths (as given / aligned view); the one-column copy
          # (the kernel's) in whole fits at 0.3-0.6 GB of X, 15 fits a side
      run gmm-odd 150 python3 benchmarks/gmm_odd_width_probe.py --out "$out/gmm_odd_width_probe_s42.json"
      grep -E "^\| [0-9]" "$log/gmm-odd.log" | cut -c1-200
      run align-ab 300 python3 benchmarks/env_ab.py --a FUSEDML_ALIGN_ROWS=0 --b FUSEDML_ALIGN_ROWS=1 \
        --shapes 3000000x27 1500000x55 1000000x101 2000000x55 5000000x27 2500000x55 --algos logistic poisson linearsvc \
        --backends fused --fits 15 --out "$out/env_ab_align_s42.json"
      grep -E "^\| " "$log/align-ab.log" | cut -c1-200 ;;
    s43)  # session 43: the register-form E-step reads rows in whole vectors too (VEC, fused._reg_vec), GaussianMixture's
          # EM reads an aligned copy where the tensor-core form runs, a streamed matrix keeps its resident rows padded
          # (align_rows): the passes (as given / aligned view, VEC on / 1; streamed align_rows False / True), the CUDA
          # tests of the GMM, mixture, k-means and streaming modules
      run gmm-odd 150 python3 benchmarks/gmm_odd_width_probe.py --only 4194304x15x16:diag 4194304x16x16:diag \
        4194304x13x8:diag 4194304x6x8:spherical --out "$out/gmm_odd_width_probe_s43.json"
      grep -E "^\| [0-9]" "$log/gmm-odd.log" | grep gmm_estep | cut -c1-200
      run stream-align 120 python3 benchmarks/stream_align_probe.py --shapes 2000000x55 4000000x13 \
        --out "$out/stream_align_probe_s43.json"
      grep -E "^\| [0-9]" "$log/stream-align.log" | cut -c1-200
      run cuda-tests 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py tests/test_kmeans.py tests/test_streaming.py
      tail -1 "$log/cuda-tests.log" | cut -c1-300 ;;
    s44)  # session 44: the register-form E-step without VEC again (its views gained nothing in s43), the tensor-core
          # form's VEC from fused._mma_vec, the streamed upload's one host pass (odd chunk layouts); the CUDA tests of
          # the GMM, mixture, k-means and streaming modules, then whole KMeans / GaussianMixture fits (ALIGN_ROWS 0 / auto)
      run cuda-tests 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py tests/test_kmeans.py tests/test_streaming.py
      tail -1 "$log/cuda-tests.log" | cut -c1-300
      run gmm-odd-fits 240 python3 benchmarks/gmm_odd_width_probe.py --fits 3 --only 4194304x15x16:diag \
        4194304x13x8:diag 4194304x6x8:spherical --out "$out/gmm_odd_width_fits_s44.json"
      grep -E "^\| [0-9].*fit" "$log/gmm-odd-fits.log" | cut -c1-200 ;;
    s49c)  # session 49: the CSR end-to-end table with flat streams on by default (an H200 rerun where one is lent)
      run e2e-csr 300 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_csr_s49c.json"
      grep -E "^\| " "$log/e2e-csr.log" | head -8 | cut -c1-200 ;;
    s49b)  # session 49: the gather product's spread between processes (s48): 4 fresh processes x 3 paddings
      run spread 300 python3 benchmarks/gather_spread_probe.py --procs 4 --pad-mib 0 1 3 \
        --out "$out/gather_spread_probe_s49b.json"
      grep -E "^\| " "$log/spread.log" | cut -c1-200 ;;
    s49)  # session 49: the stream pass's segment totals through inline red (STREAM_INLINE_RED) against
          # tl.atomic_add: CUDA tests, the passes side by side, CSR fits A/B; the review's one row-tile
          # loop of the accept-test sums (3d901ab) compiled; the CSR mmchain table rows
      run cuda-csr 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_mmchain_csr.py
      tail -1 "$log/cuda-csr.log" | cut -c1-300
      run cuda-cg 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_cg.py tests/test_algorithms_base.py
      tail -1 "$log/cuda-cg.log" | cut -c1-300
      run csr-red 300 python3 benchmarks/bench_csr_tiles.py --matrices 1000000x100000:32:powerlaw \
        1000000x4000000:32:powerlaw --tiles 0 --red --kernel 2048x8x4 4096x8x2 2048x4x8 1024x4x8 \
        --out "$out/csr_tiles_red_s49.json"
      grep -E "^\| " "$log/csr-red.log" | cut -c1-200
      run red-ab 300 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:STREAM_INLINE_RED=False \
        --b fusedml.mmchain.csr:STREAM_INLINE_RED=True --csr 32:powerlaw --shapes 1000000x100000 \
        --algos logistic poisson linearsvc --backends fused --fits 5 --out "$out/env_ab_csr_red_s49.json"
      grep -E "^\| " "$log/red-ab.log" | cut -c1-200 ;;
    s52c)  # session 52: the CUDA tests of the modules changed after part s52 (Jacobi-scaled Ridge, nearest_labels,
           # the GMM sums' float64 recompute, fit_distributed's checks run on the CPU suite)
      run cuda-s52c 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda \
        tests/test_algorithms_linear.py tests/test_kmeans.py tests/test_gmm.py tests/test_algorithms_mixture.py
      tail -3 "$log/cuda-s52c.log" | cut -c1-300 ;;
    s52b)  # session 52: the 1M x 100 dense fits 1.5-2.3 ms slower (fused and ops; not logistic) than in s39c on
           # an H100, the GMM fit's ops 164 -> 264 ms: the code at session 50's end (a tree in $S52_OLD) against this
           # one, alternating, fused and ops
      for round in 1 2; do
        for side in old new; do
          dir=.; [ "$side" = old ] && dir=${S52_OLD:?}
          run "e2e-$side-$round" 150 env -C "$dir" PYTHONPATH="$(cd "$dir" && pwd):$PYTHONPATH" python3 \
            benchmarks/bench_end_to_end.py --parts dense --backends fused ops --repeat 5 --no-plots \
            --out "$(cd "$out" && pwd)/end_to_end_dense1M_${side}_${round}_s52b.json"
          grep -E "^\| synthetic" "$log/e2e-$side-$round.log" | head -6 | cut -c1-200
          run "gmm-$side-$round" 120 env -C "$dir" PYTHONPATH="$(cd "$dir" && pwd):$PYTHONPATH" python3 \
            benchmarks/bench_end_to_end.py --parts gmm --backends fused ops --repeat 5 --no-plots \
            --out "$(cd "$out" && pwd)/end_to_end_gmm_${side}_${round}_s52b.json"
          grep -E "^\| synthetic" "$log/gmm-$side-$round.log" | head -1 | cut -c1-200
        done
      done ;;
    s52)  # session 52: Ridge's shifted fits compiled (CUDA test); the README's tables on the current code (an H200 where lent): mmchain, the dense, CSR and
          # GMM fits; then STREAM_CONTIG = 4 against 0 in whole CSR fits (session 50's open A/B)
      run cuda-linear 120 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_algorithms_linear.py
      tail -1 "$log/cuda-linear.log" | cut -c1-300
      run mmchain 240 python3 benchmarks/bench_mmchain.py --max-csr-sweep 3 --out "$out/mmchain_s52.json"
      grep -E "^\| " "$log/mmchain.log" | cut -c1-200
      run e2e-csr 300 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_csr_s52.json"
      grep -E "^\| synthetic" "$log/e2e-csr.log" | head -5 | cut -c1-200
      run e2e-gmm 150 python3 benchmarks/bench_end_to_end.py --parts gmm --repeat 5 --no-plots \
        --out "$out/end_to_end_gmm_s52.json"
      grep -E "^\| synthetic" "$log/e2e-gmm.log" | head -1 | cut -c1-200
      run contig-ab 240 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:STREAM_CONTIG=0 \
        --b fusedml.mmchain.csr:STREAM_CONTIG=4 --csr 32:powerlaw --shapes 1000000x100000 \
        --algos logistic poisson ridge --backends fused --fits 7 --out "$out/env_ab_csr_contig_s52.json"
      grep -E "^\| " "$log/contig-ab.log" | cut -c1-200
      run e2e-dense 420 python3 benchmarks/bench_end_to_end.py --parts dense large --repeat 5 --sklearn-budget 5 \
        --no-plots --out "$out/end_to_end_dense_s52.json"
      grep -E "^\| synthetic" "$log/e2e-dense.log" | head -24 | cut -c1-200 ;;
    s51)  # session 51: tiled streams gathering from shared memory (STREAM_SMEM, tl.gather; removed in session 52) against L1 gathers:
          # CUDA tests, the passes alternating, whole CSR fits A/B; fits given a torch sparse tensor against a
          # CSRMatrix (as_csr_remembered, untimed in s50); then the README's mmchain table and CSR fits
      run cuda-smem 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k "cuda and (smem or stream_totals)" \
        tests/test_mmchain_csr.py
      tail -1 "$log/cuda-smem.log" | cut -c1-300
      run csr-smem 300 python3 benchmarks/bench_csr_tiles.py --matrices 1000000x100000:32:powerlaw \
        4000000x100000:32:uniform --tiles 0 --smem --out "$out/csr_tiles_smem_s51.json"
      grep -E "^\| " "$log/csr-smem.log" | cut -c1-200
      run smem-ab 300 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:STREAM_SMEM=False \
        --b fusedml.mmchain.csr:STREAM_SMEM=True --csr 32:powerlaw --shapes 1000000x100000 \
        --algos logistic poisson --backends fused --fits 5 --out "$out/env_ab_csr_smem_s51.json"
      grep -E "^\| " "$log/smem-ab.log" | cut -c1-200
      run csr-input 200 python3 benchmarks/csr_input_probe.py --algos logistic poisson --fits 5 \
        --out "$out/csr_input_probe_s51.json"
      grep -E "^\| " "$log/csr-input.log" | cut -c1-200
      [ -n "${S51_TABLES:-}" ] || exit 0
      run mmchain 240 python3 benchmarks/bench_mmchain.py --max-csr-sweep 3 --out "$out/mmchain_s51.json"
      grep -E "^\| " "$log/mmchain.log" | cut -c1-200
      run e2e-csr 300 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_csr_s51.json"
      grep -E "^\| " "$log/e2e-csr.log" | head -12 | cut -c1-200 ;;
    s50)  # session 50: the stream kernel's elements per thread (STREAM_CONTIG: 0 = the loads' width, 1, 2, 4)
          # with each way of adding segment totals: the passes side by side (tiled 1M x 100k, flat 1M x 4M),
          # their CUDA tests, whole CSR fits A/B of the tiled streams' best setting if it beat 0 by > 3 %,
          # then fits given a torch sparse tensor against a CSRMatrix
      run csr-contig 300 python3 benchmarks/bench_csr_tiles.py --matrices 1000000x100000:32:powerlaw \
        1000000x4000000:32:powerlaw --tiles 0 --contig 0 1 2 4 0 --out "$out/csr_tiles_contig_s50.json"
      grep -E "^\| " "$log/csr-contig.log" | cut -c1-200
      run cuda-csr 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k "cuda and stream_totals" tests/test_mmchain_csr.py
      tail -1 "$log/cuda-csr.log" | cut -c1-300
      best=$(python3 - "$out/csr_tiles_contig_s50.json" <<'PY'
import json, re, statistics, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["m"] == 1 and r["matrix"].startswith("powerlaw-1000000x100000")]
t = {}
for r in rows:
    m = re.fullmatch(r"fused \d+ KB, contig (\d), (inline red|tl.atomic_add)", r["variant"])
    if m:
        t.setdefault((int(m[1]), m[2] == "inline red"), []).append(r["ms"])
base = statistics.median(t[(0, False)])
(c, inl), ms = min(((k, statistics.median(v)) for k, v in t.items() if k[0]), key=lambda kv: kv[1])
print(f"{c} {inl}" if ms < 0.97 * base else "")
PY
)
      echo "tiled streams' best contig setting: '${best:-none}'"
      if [ -n "$best" ]; then
        set -- $best
        run contig-ab 300 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:STREAM_CONTIG=0 \
          --b fusedml.mmchain.csr:STREAM_CONTIG=$1 fusedml.mmchain.csr:STREAM_INLINE_RED=$2 --csr 32:powerlaw \
          --shapes 1000000x100000 --algos logistic poisson --backends fused --fits 5 \
          --out "$out/env_ab_csr_contig_s50.json"
        grep -E "^\| " "$log/contig-ab.log" | cut -c1-200
      fi
      run csr-input 200 python3 benchmarks/csr_input_probe.py --algos logistic poisson --fits 5 \
        --out "$out/csr_input_probe_s50.json"
      grep -E "^\| " "$log/csr-input.log" | cut -c1-200 ;;
    s49e)  # session 49, after s49: inline red on flat streams only (STREAM_INLINE_RED = "flat"): CUDA tests,
           # the 1M x 1M power-law passes both ways, the CSR end-to-end table
      run cuda-csr 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_mmchain_csr.py
      tail -1 "$log/cuda-csr.log" | cut -c1-300
      run csr-red 200 python3 benchmarks/bench_csr_tiles.py --matrices 1000000x1000000:32:powerlaw --tiles 0 --red \
        --out "$out/csr_tiles_red_s49e.json"
      grep -E "^\| " "$log/csr-red.log" | cut -c1-200
      run e2e-csr 300 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_csr_s49e.json"
      grep -E "^\| " "$log/e2e-csr.log" | head -8 | cut -c1-200 ;;
    s49d)  # session 49, after s49/s49c: the CSR mmchain table rows; wide fits A/B of the flat streams (s48d)
      run mmchain-csr 200 python3 benchmarks/bench_mmchain.py --cases csr-4Mx100k,csr-1Mx1M,csr-powerlaw \
        --max-csr-sweep 3 --out "$out/mmchain_csr_s49d.json"
      grep -E "^\| " "$log/mmchain-csr.log" | cut -c1-200
      run flat-ab 300 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:FLAT_PASSES=0 \
        --b fusedml.mmchain.csr:FLAT_PASSES=3 --csr 32:powerlaw --shapes 1000000x4000000 1000000x1000000 \
        --algos logistic poisson --backends fused ops --fits 5 --out "$out/env_ab_csr_flat_s49d.json"
      grep -E "^\| " "$log/flat-ab.log" | cut -c1-200 ;;
    s48e)  # session 48, device time short: the solvers' CUDA fits with flat streams on by default
      run cuda-fits 120 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_algorithms_base.py
      tail -1 "$log/cuda-fits.log" | cut -c1-300 ;;
    s48d)  # session 48, after s48b/c: flat streams on by default (FLAT_PASSES = 3, binned untiled passes only):
           # their CUDA tests and the solvers' fits, wide fits A/B (5 fits, ops beside), the CSR mmchain table rows
      [ -n "${S48_FLAT_TESTS:-}" ] && run cuda-flat 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k "cuda_flat" \
        tests/test_mmchain_csr.py && tail -1 "$log/cuda-flat.log" | cut -c1-300  # (passed in s48b; device time short)
      run cuda-fits 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_algorithms_base.py
      tail -1 "$log/cuda-fits.log" | cut -c1-300
      run flat-ab 300 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:FLAT_PASSES=0 \
        --b fusedml.mmchain.csr:FLAT_PASSES=3 --csr 32:powerlaw --shapes 1000000x4000000 1000000x1000000 \
        --algos logistic poisson --backends fused ops --fits 5 --out "$out/env_ab_csr_flat_s48d.json"
      grep -E "^\| " "$log/flat-ab.log" | cut -c1-200
      run mmchain-csr 200 python3 benchmarks/bench_mmchain.py --cases csr-4Mx100k,csr-1Mx1M,csr-powerlaw \
        --max-csr-sweep 3 --out "$out/mmchain_csr_s48d.json"
      grep -E "^\| " "$log/mmchain-csr.log" | cut -c1-200 ;;
    s48c)  # session 48: whole wide power-law CSR fits with the flat streams (FLAT_PASSES=3) against the row kernels
      run flat-ab 300 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:FLAT_PASSES=0 \
        --b fusedml.mmchain.csr:FLAT_PASSES=3 --csr 32:powerlaw --shapes 1000000x4000000 1000000x1000000 \
        --algos logistic poisson --backends fused --fits 3 --out "$out/env_ab_csr_flat_s48c.json"
      grep -E "^\| " "$log/flat-ab.log" | cut -c1-200 ;;
    s48b)  # session 48: flat streams (CSRConfig.flat) for the untiled wide passes, against the row kernels and ops
      run cuda-flat 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k "cuda_flat or stream" tests/test_mmchain_csr.py
      tail -1 "$log/cuda-flat.log" | cut -c1-300
      run csr-flat 400 python3 benchmarks/bench_csr_tiles.py --matrices 1000000x4000000:32:powerlaw \
        1000000x1000000:32:powerlaw 1000000x1000000:100:constant --tiles 0 32768 --flat --l1-bypass \
        --out "$out/csr_tiles_flat_s48b.json"
      grep -E "^\| " "$log/csr-flat.log" | cut -c1-200 ;;
    s48)  # next session: does a CSR product leave L2 in a state that slows a later one (s47i)? The 1M-column gather
          # timed before and after the 4M matrix's scatter, after a 2 x L2 copy, after dropping the 4M matrix
      run l2-probe 200 python3 benchmarks/l2_state_probe.py --out "$out/l2_state_probe_s48.json"
      grep -E "^\| " "$log/l2-probe.log" | cut -c1-200
      run l2-probe-gather 200 python3 benchmarks/l2_state_probe.py --a-strategy gather \
        --out "$out/l2_state_probe_gather_s48.json"
      grep -E "^\| " "$log/l2-probe-gather.log" | cut -c1-200
      # the review's (1, P) grid of the one-program accept-test sums (6da2650), not yet run compiled
      run cuda-cg 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_cg.py tests/test_algorithms_base.py
      tail -1 "$log/cuda-cg.log" | cut -c1-300 ;;
    s47i)  # session 47, after s47f: the scatter strategy (one pass, float atomics) on the wide power-law products
      run csr-scatter 150 python3 benchmarks/bench_csr_tiles.py --matrices 1000000x4000000:32:powerlaw \
        1000000x1000000:32:powerlaw --tiles 0 --scatter --out "$out/csr_tiles_scatter_s47i.json"
      grep -E "^\| " "$log/csr-scatter.log" | cut -c1-200 ;;
    s47h)  # session 47, after s47g (the wide fit test's fused logistic ended 2.4e-2 apart at tol 1e-5): at tol 1e-8,
           # three times
      for i in 1 2 3; do
        run cuda-wide-$i 150 env TRITON_INTERPRET=0 python3 -m pytest -q -s -k "cuda and split" tests/test_algorithms_base.py
        grep -E "split vs one program|passed|failed" "$log/cuda-wide-$i.log" | cut -c1-300
      done ;;
    s47g)  # session 47, on an H200: the CSR end-to-end table with both split forms on, the solvers' CUDA tests
      run cuda-cg 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_cg.py tests/test_algorithms_base.py
      tail -1 "$log/cuda-cg.log" | cut -c1-300
      run e2e-csr 240 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_csr_s47g.json"
      grep -E "^\| " "$log/e2e-csr.log" | head -7 | cut -c1-200 ;;
    s47f)  # session 47, after s47e: CSR fits at 4M features were slower fused than ops (logistic 86 against 76 ms):
           # the products' tile settings at 100k, 1M and 4M columns, and where those fits' GPU time goes
      run csr-tiles 300 python3 benchmarks/bench_csr_tiles.py --matrices 1000000x4000000:32:powerlaw \
        1000000x1000000:32:powerlaw 1000000x100000:32:powerlaw --tiles 0 16384 32768 65536 --out "$out/csr_tiles_wide_s47f.json"
      grep -E "^\| " "$log/csr-tiles.log" | cut -c1-200
      run csr-profile 150 python3 benchmarks/profile_fit.py --csr 1000000x4000000:32:powerlaw --algo logistic \
        --top 10 --out "$out/profile_fit_csr_4M_s47f.json"
      grep -E "^\| " "$log/csr-profile.log" | cut -c1-200 ;;
    s47e)  # session 47, after s47d: the split forms take any length (programs sweep several row tiles past
           # SPLIT_PROGRAMS = 1024 a problem; MAX_SPLIT_ENTRIES removed): the solvers' CUDA tests, wide CSR fits
           # A/B (4M features: the torch form against the split forms), the CSR multinomial (500k entries) A/B
      run cuda-cg 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_cg.py tests/test_algorithms_base.py
      tail -1 "$log/cuda-cg.log" | cut -c1-300
      run wide-ab 200 python3 benchmarks/env_ab.py --a fusedml.cg:SPLIT_ENTRIES=None --b fusedml.cg:SPLIT_ENTRIES=16384 \
        --csr 32:powerlaw --shapes 1000000x4000000 --algos logistic poisson --backends fused ops --fits 3 \
        --out "$out/env_ab_cg_split_4M_s47e.json"
      grep -E "^\| " "$log/wide-ab.log" | cut -c1-200
      run multi-ab 200 python3 benchmarks/env_ab.py --a fusedml.cg:SPLIT_ENTRIES=None --b fusedml.cg:SPLIT_ENTRIES=16384 \
        --csr 32:powerlaw --shapes 1000000x100000 --algos multinomial --backends fused ops --fits 3 \
        --out "$out/env_ab_cg_split_multinomial_s47e.json"
      grep -E "^\| " "$log/multi-ab.log" | cut -c1-200 ;;
    s47d)  # session 47, after s47c: the wide split fit test compares outputs, not loose coefficients
      run cuda-wide 200 env TRITON_INTERPRET=0 python3 -m pytest -q -s -k "cuda and split" tests/test_algorithms_base.py
      grep -E "split vs one program|passed|failed" "$log/cuda-wide.log" | cut -c1-300 ;;
    s47c)  # (MAX_SPLIT_ENTRIES was removed after this part: the split forms now take any length)
           # session 47, after s47b: the accept test's sums split like the CG update (two launches past
           # SPLIT_ENTRIES; one program per problem took 0.105 ms a call at 100k entries in s47's profile): all
           # CUDA tests of the solvers, whole CSR fits A/B of both split forms (none / both), the CSR table
      run cuda-cg 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_cg.py tests/test_algorithms_base.py
      tail -1 "$log/cuda-cg.log" | cut -c1-300
      run csr-ab 200 python3 benchmarks/env_ab.py --a fusedml.cg:SPLIT_ENTRIES=None --b fusedml.cg:SPLIT_ENTRIES=16384 \
        --csr 32:powerlaw --shapes 1000000x100000 --algos logistic ridge poisson --backends fused ops --fits 5 \
        --out "$out/env_ab_cg_trial_split_s47c.json"
      grep -E "^\| " "$log/csr-ab.log" | cut -c1-200
      run wide-ab 150 python3 benchmarks/env_ab.py --a fusedml.cg:MAX_SPLIT_ENTRIES=0 \
        --b fusedml.cg:MAX_SPLIT_ENTRIES=1048576 --csr 32:powerlaw --shapes 1000000x1000000 --algos logistic poisson \
        --backends fused --fits 3 --out "$out/env_ab_cg_trial_split_wide_s47c.json"
      grep -E "^\| " "$log/wide-ab.log" | cut -c1-200
      run e2e-csr 240 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_csr_s47c.json"
      grep -E "^\| " "$log/e2e-csr.log" | head -7 | cut -c1-200 ;;
    s47b)  # (MAX_SPLIT_ENTRIES was removed after s47c: the split forms now take any length)
           # session 47, after s47: the split form up to MAX_SPLIT_ENTRIES (1M entries; was the torch form past
           # 131k): its CUDA tests, wide CSR fits A/B; where the host-bound Poisson fits' host time goes (timelines,
           # traces with stacks: CSR 1M x 100k and dense 1M x 100)
      run cuda-split 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k "cuda and split" tests/test_cg.py
      tail -1 "$log/cuda-split.log" | cut -c1-300
      run wide-ab 200 python3 benchmarks/env_ab.py --a fusedml.cg:MAX_SPLIT_ENTRIES=0 --b fusedml.cg:MAX_SPLIT_ENTRIES=1048576 \
        --csr 32:powerlaw --shapes 1000000x1000000 --algos logistic ridge --backends fused --fits 3 \
        --out "$out/env_ab_cg_split_wide_s47b.json"
      grep -E "^\| " "$log/wide-ab.log" | cut -c1-200
      run tl-csr 120 python3 benchmarks/host_timeline.py --csr 32:powerlaw --shape 1000000x100000 --algo poisson \
        --min-us 40 --out "$out/host_timeline_poisson_csr_s47b.json"
      grep -E "fit: " "$log/tl-csr.log" | cut -c1-200
      run tl-dense 120 python3 benchmarks/host_timeline.py --shape 1000000x100 --algo poisson --min-us 40 \
        --out "$out/host_timeline_poisson_dense_s47b.json"
      grep -E "fit: " "$log/tl-dense.log" | cut -c1-200
      mkdir -p "$out/traces"
      run trace-csr 150 python3 benchmarks/profile_fit.py --csr 1000000x100000:32:powerlaw --algo poisson \
        --backends fused --trace-dir "$out/traces" --trace-stacks --out "$out/profile_fit_poisson_csr_s47b.json"
      run trace-dense 150 python3 benchmarks/profile_fit.py --shape 1000000x100 --algo poisson --backends fused \
        --trace-dir "$out/traces" --trace-stacks --out "$out/profile_fit_poisson_dense_s47b.json"
      for f in "$out"/traces/*.json; do python3 benchmarks/trace_gaps.py "$f" --top 12 > "${f%.json}.gaps.txt" 2>&1; done
      gzip -f "$out"/traces/*.json ;;
    s47)  # session 47: the CG update's split form on by default (SPLIT_ENTRIES = 16384): its CUDA tests (kernel
          # against float64 and the one-program form; wide CSR fits), where a CSR fit's GPU time goes now, the CSR
          # end-to-end table
      run cuda-split 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k "cuda and split" tests/test_cg.py \
        tests/test_algorithms_base.py
      tail -1 "$log/cuda-split.log" | cut -c1-300
      run csr-profile 150 python3 benchmarks/profile_fit.py --csr 1000000x100000:32:powerlaw --algo logistic \
        --algo poisson --top 12 --out "$out/profile_fit_csr_s47.json"
      grep -E "^\| " "$log/csr-profile.log" | cut -c1-200
      run e2e-csr 240 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_csr_s47.json"
      grep -E "^\| " "$log/e2e-csr.log" | cut -c1-200 ;;
    s46)  # session 46: the streamed CSR product's two-launch epilogue (A/B in whole CSR fits, float64 checks, CUDA
          # tests with the streamed upload through torch's strided copy); the CSR power-law row's run-to-run spread;
          # the host EM loop's trusted E-steps (A/B); where a CSR fit's GPU time goes
      run csr-ab 200 python3 benchmarks/env_ab.py --a fusedml.mmchain.csr:_STREAM_EPILOGUE=False \
        --b fusedml.mmchain.csr:_STREAM_EPILOGUE=True --csr 32:powerlaw --shapes 1000000x100000 \
        --algos logistic ridge poisson --backends fused --fits 7 --out "$out/env_ab_stream_epilogue_s46.json"
      grep -E "^\| " "$log/csr-ab.log" | cut -c1-200
      run check-mm 150 python3 benchmarks/check_gpu.py --parts mmchain --out "$out/check_gpu_s46.json"
      tail -3 "$log/check-mm.log" | cut -c1-200
      run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_streaming.py \
        tests/test_mmchain_csr.py
      tail -1 "$log/cuda-tests.log" | cut -c1-300
      run call-probe 150 python3 benchmarks/call_probe.py --out "$out/call_probe_s46.json"
      grep -E "^\| " "$log/call-probe.log" | cut -c1-200
      run gmm-ab 200 python3 benchmarks/env_ab.py --a algorithms.mixture:_TRUSTED_ESTEP=False \
        --b algorithms.mixture:_TRUSTED_ESTEP=True --shapes 1000000x16 --algos gmm-full gmm-tied \
        --backends fused ops --fits 5 --out "$out/env_ab_trusted_estep_s46.json"
      grep -E "^\| " "$log/gmm-ab.log" | cut -c1-200
      run csr-profile 150 python3 benchmarks/profile_fit.py --csr 1000000x100000:32:powerlaw --algo logistic --algo ridge \
        --top 16 --out "$out/profile_fit_csr_s46.json"
      grep -E "^\| " "$log/csr-profile.log" | cut -c1-200 ;;
    s46c)  # session 46, after s46: the CG step's vector half over many programs beyond SPLIT_ENTRIES (the one-program
           # kernel took 0.11 ms a step at D = 100k in s46's CSR profile; off by default until this runs): whole CSR
           # fits A/B (the same iterations on both sides is the compiled form's check: the CUDA tests below run the
           # default, one program), the solvers' CUDA tests
      run csr-cg-ab 200 python3 benchmarks/env_ab.py --a fusedml.cg:SPLIT_ENTRIES=None --b fusedml.cg:SPLIT_ENTRIES=16384 \
        --csr 32:powerlaw --shapes 1000000x100000 --algos logistic ridge poisson --backends fused ops --fits 5 \
        --out "$out/env_ab_cg_split_s46c.json"
      grep -E "^\| " "$log/csr-cg-ab.log" | cut -c1-200
      run cuda-cg 150 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_cg.py tests/test_algorithms_base.py
      tail -1 "$log/cuda-cg.log" | cut -c1-300 ;;
    s46b)  # session 46, after s46: the trusted E-steps' host timelines, Dask GMM fits A/B, the mixture CUDA tests
      run tl-estep 120 python3 benchmarks/host_timeline.py --estep 8:diag --shape 4000000x13 --min-us 8 --warm 5 \
        --out "$out/host_timeline_estep_s46.json"
      grep -E "^(in memory|streamed)" "$log/tl-estep.log" | cut -c1-160
      run cuda-mix 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_algorithms_mixture.py \
        tests/test_distributed.py
      tail -1 "$log/cuda-mix.log" | cut -c1-300
      run gmm-ab-dask 150 python3 benchmarks/env_ab.py --a algorithms.mixture:_TRUSTED_ESTEP=False \
        --b algorithms.mixture:_TRUSTED_ESTEP=True --shapes 1000000x16 --algos gmm-diag gmm-full \
        --backends fused --fits 5 --dask 250000 --out "$out/env_ab_trusted_estep_dask_s46.json"
      grep -E "^\| " "$log/gmm-ab-dask.log" | cut -c1-200 ;;
    s45b)  # session 45, after s45: streamed resident rows padded on the device after an unpadded upload (was: in the
           # host's pinned pass, 4-6 ms slower fits), only rows over 64 bytes under auto; the streaming CUDA tests
      run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_streaming.py tests/test_distributed.py
      tail -1 "$log/cuda-tests.log" | cut -c1-300
      run align-dask 300 python3 benchmarks/env_ab.py --a FUSEDML_ALIGN_ROWS=0 --b FUSEDML_ALIGN_ROWS=auto \
        --shapes 2000000x55 1000000x101 --algos logistic poisson ridge --backends fused --fits 7 --dask 500000 \
        --out "$out/env_ab_align_dask_s45b.json"
      grep -E "^\| " "$log/align-dask.log" | cut -c1-200 ;;
    s45)  # session 45: the streamed E-step's host cost (0.064 ms a call over in-memory at 4M x 13, K = 8 in s44):
          # one warm call's host timeline in memory and streamed (all resident)
      run tl-estep 120 python3 benchmarks/host_timeline.py --estep 8:diag --shape 4000000x13 --min-us 8 --warm 5 \
        --out "$out/host_timeline_estep_s45.json"
      grep -E "^(in memory|streamed)|StreamedMatrix|map_blocks|_sum|cat|WAIT" "$log/tl-estep.log" | cut -c1-160 ;;
    s44b)  # session 44: the streamed matrix's padded resident rows in whole linear fits on Dask input (upload
           # included; FUSEDML_ALIGN_ROWS=0 / auto), rows of 13 and 55; the CUDA tests of the final code
      run align-dask 240 python3 benchmarks/env_ab.py --a FUSEDML_ALIGN_ROWS=0 --b FUSEDML_ALIGN_ROWS=auto \
        --shapes 4000000x13 2000000x55 --algos logistic poisson ridge --backends fused --fits 7 --dask 500000 \
        --out "$out/env_ab_align_dask_s44.json"
      grep -E "^\| " "$log/align-dask.log" | cut -c1-200
      run cuda-tests 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py tests/test_algorithms_base.py tests/test_streaming.py
      tail -1 "$log/cuda-tests.log" | cut -c1-300 ;;
    s43b)  # session 43: whole fused KMeans / GaussianMixture fits with FUSEDML_ALIGN_ROWS=0 / auto
      run gmm-odd-fits 240 python3 benchmarks/gmm_odd_width_probe.py --fits 3 --only 4194304x15x16:diag \
        4194304x13x8:diag 4194304x6x8:spherical --out "$out/gmm_odd_width_fits_s43.json"
      grep -E "^\| [0-9].*fit" "$log/gmm-odd-fits.log" | cut -c1-200 ;;
    s42b)  # session 42: KMeans and GaussianMixture's k-means start read an aligned copy of odd-width rows, the
           # tensor-core E-step reads aligned views in whole vectors: the passes (view / as given / D = 16) and whole
           # fused fits with FUSEDML_ALIGN_ROWS=0 / auto; the CUDA tests of the mixtures and k-means
      run gmm-odd-fits 240 python3 benchmarks/gmm_odd_width_probe.py --fits 3 --only 4194304x15x16:diag \
        4194304x16x16:diag 4194304x13x12:diag 2097152x31x32:diag --out "$out/gmm_odd_width_fits_s42b.json"
      grep -E "^\| [0-9]" "$log/gmm-odd-fits.log" | cut -c1-200
      run cuda-mix 200 env TRITON_INTERPRET=0 python3 -m pytest -q -x -k cuda tests/test_algorithms_mixture.py \
        tests/test_kmeans.py
      tail -1 "$log/cuda-mix.log" | cut -c1-300 ;;
    s39d)  # session 39: warm fits' host timelines, call by call (host_timeline.py): 1M x 100 logistic and Poisson on
           # both backends, 2M x 256 logistic fused
      for spec in logistic:1000000x100:fused logistic:1000000x100:ops poisson:1000000x100:fused \
                  logistic:2000000x256:fused; do
        IFS=: read -r algo shape be <<< "$spec"
        run tl-$algo-$shape-$be 120 python3 benchmarks/host_timeline.py --algo $algo --shape $shape --backend $be \
          --min-us 15 --out "$out/host_timeline_${algo}_${shape}_${be}_s39d.json"
        head -3 "$log/tl-$algo-$shape-$be.log" | cut -c1-200
      done ;;
    s39g)  # session 39: repeated launches pass None for Triton's empty launch hooks and their metadata
           # (fusedml._launch.SKIP_EMPTY_HOOKS): the solvers' CUDA tests; the A/B in one process, fit by fit; a timeline
      run cuda-solvers 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_algorithms_base.py
      tail -1 "$log/cuda-solvers.log" | cut -c1-300
      run hooks-ab 300 python3 benchmarks/env_ab.py --a fusedml._launch:SKIP_EMPTY_HOOKS=False \
        --b fusedml._launch:SKIP_EMPTY_HOOKS=True --algos logistic multinomial linearsvc poisson ridge --fits 15 \
        --out "$out/env_ab_hooks_s39g.json"
      grep -E "^\| " "$log/hooks-ab.log" | cut -c1-200
      run tl 120 python3 benchmarks/host_timeline.py --algo logistic --shape 1000000x100 --backend fused --min-us 15 \
        --out "$out/host_timeline_logistic_1000000x100_fused_s39g.json"
      head -1 "$log/tl.log" ;;
    s39h)  # session 39: the host cost of one call of each operator, bound launches with and without Triton's launch
           # hooks built (host_overhead.py; its fit A/B reduced to one tiny Ridge case)
      run host-overhead 200 python3 benchmarks/host_overhead.py --calls 2000 --ab-shapes 100000x16 --ab-reps 3 \
        --ab-algos ridge --cprofile 5 --out "$out/host_overhead_s39h.json"
      grep -E " us$" "$log/host-overhead.log" | cut -c1-120 ;;
    s39f)  # session 39: a fuzz campaign of whole fits on the GPU (the solves started ahead); the solve-ahead A/B again on
           # another machine start (2M x 256, 21 fits a side)
      run fuzz-fit 240 python3 tests/fuzz.py --device cuda --n 60 --seed 39100 --ops fit
      grep -E "^FAIL|cases passed" "$log/fuzz-fit.log" | cut -c1-400 | tail -8
      run ahead-ab2 240 python3 benchmarks/env_ab.py --a FUSEDML_SOLVE_AHEAD=0 --b FUSEDML_SOLVE_AHEAD=1 \
        --shapes 2000000x256 --algos logistic linearsvc poisson --fits 21 --out "$out/env_ab_ahead_s39f.json"
      grep -E "^\| " "$log/ahead-ab2.log" | cut -c1-200 ;;
    s39e)  # session 39: the host timelines again with Python's garbage collections recorded (three runs of each)
      for r in 1 2 3; do
        for spec in logistic:1000000x100:fused linearsvc:1000000x100:fused logistic:2000000x256:fused; do
          IFS=: read -r algo shape be <<< "$spec"
          run tl-$algo-$shape-$be-$r 120 python3 benchmarks/host_timeline.py --algo $algo --shape $shape --backend $be \
            --min-us 15 --out "$out/host_timeline_${algo}_${shape}_${be}_s39e_$r.json"
          head -1 "$log/tl-$algo-$shape-$be-$r.log" | cut -c1-200; grep "GC gen" "$log/tl-$algo-$shape-$be-$r.log"
        done
      done ;;
    s39c)  # session 39, final code: the README's end-to-end tables (dense 1M x 100 ... 16M x 64, medians of 5; CSR
           # 1M x 100k power-law rows, medians of 3), both GPU backends and scikit-learn
      run e2e-dense 420 python3 benchmarks/bench_end_to_end.py --parts dense large --repeat 5 --sklearn-budget 5 \
        --no-plots --out "$out/end_to_end_dense_s39c.json"
      grep -E "^\| synthetic" "$log/e2e-dense.log" | cut -c1-200
      run e2e-csr 240 python3 benchmarks/bench_end_to_end.py --parts csr --repeat 3 --sklearn-budget 2 --no-plots \
        --out "$out/end_to_end_csr_s39c.json"
      grep -E "^\| synthetic" "$log/e2e-csr.log" | cut -c1-200 ;;
    s39b)  # session 39: the pinned-buffer pool against a new buffer each time, in one process (FUSEDML_PINNED_POOL;
           # within noise, so the pool was removed after this run: the switch no longer exists and both sides now run
           # the same code); the 2M x 256 logistic and Poisson fits' host functions by cumulative time (cProfile, us)
      run pinned-ab 240 python3 benchmarks/env_ab.py --a FUSEDML_PINNED_POOL=0 --b FUSEDML_PINNED_POOL=1 \
        --algos logistic linearsvc poisson ridge --fits 15 --out "$out/env_ab_pinned_s39b.json"
      grep -E "^\| " "$log/pinned-ab.log" | cut -c1-200
      run host-prof 150 python3 benchmarks/profile_fit.py --shape 2000000x256 --algo logistic --algo poisson \
        --backends fused --cprofile 80 --out "$out/profile_fit_s39b.json"
      grep -A82 "cum us" "$log/host-prof.log" | cut -c1-160 ;;
    s39)  # session 39: each solve's restart and first product queued behind the host's read (FUSEDML_SOLVE_AHEAD):
          # the solvers' CUDA tests; reading first against starting ahead in one process, fit by fit (both backends,
          # 1M x 100 and 2M x 256); the new code's traces of the 2M x 256 logistic and Poisson fits, their GPU gaps
      run cuda-solvers 240 env TRITON_INTERPRET=0 python3 -m pytest -q -k cuda tests/test_algorithms_base.py
      tail -3 "$log/cuda-solvers.log" | cut -c1-300
      run ahead-ab 300 python3 benchmarks/env_ab.py --a FUSEDML_SOLVE_AHEAD=0 --b FUSEDML_SOLVE_AHEAD=1 \
        --algos logistic multinomial linearsvc poisson ridge --fits 15 --out "$out/env_ab_ahead_s39.json"
      grep -E "^\| " "$log/ahead-ab.log" | cut -c1-200
      trace_fits s39 logistic poisson ;;
    s38e)  # session 38 on the H200: the README's tables on the current code (mmchain with its sweep; the solver
           # passes, m = 1 and m = 3 / 5); X^T V with m = 5 / 8, the unrolled kernel (the model) against the padded dot
      run mmchain 150 python3 benchmarks/bench_mmchain.py --max-csr-sweep 3 --out "$out/mmchain_s38e.json"
      grep -E "^\| (dense|csr)" "$log/mmchain.log" | cut -c1-200
      solver_ops s38e_m1 1000000x100 2000000x256 4000000x64
      solver_ops s38e_m3 1000000x100x3 4000000x64x3 16000000x64x3 2000000x256x3 2000000x256x5
      hessian_probe probe-xtv 150 s38e_xtv --cases xtv5 xtv8 xtv5-512 --only "padded dot" ;;
    s38d)  # session 38: the final code's deferred X check against the up-front one, in one process, fit by fit
      run finite-ab 300 python3 benchmarks/finite_check_ab.py --fits 21 --out "$out/finite_check_ab_s38d.json"
      grep -E "^\| " "$log/finite-ab.log" | cut -c1-200 ;;
    s38c)  # session 38, after s38b (5 fits a side: within the runs' noise but for logistic): 15 fits a side; the new
           # code's trace of the 2M x 256 logistic fit
      fits_ab 15
      trace_fits s38c logistic linearsvc ;;
    s38)  # session 38: the fuzz case mmchain:38138 replayed (its forced launch beyond the GPU now a ValueError); the
          # 1024-value-row launches as the model's pick; where the 2M x 256 m = 1 fits' wall time goes (traces with
          # Python stacks, their GPU idle gaps, cProfile)
      run fuzz-replay 120 python3 tests/fuzz.py --device cuda --case mmchain:38138
      tail -4 "$log/fuzz-replay.log" | cut -c1-400
      hessian_probe probe-lib 150 s38_lib1024 --cases softmax3-1024 mul3-1024 --only
      run trace 300 python3 benchmarks/profile_fit.py --shape 2000000x256 --algo logistic --algo poisson --cprofile 45 \
        --trace-dir "$out/traces" --trace-stacks --out "$out/profile_fit_s38.json"
      grep -E "^\| 2000000" "$log/trace.log" | cut -c1-200
      for f in "$out"/traces/trace-*-fused*.json; do echo "### $f"; python3 benchmarks/trace_gaps.py "$f" --top 25; done \
        > "$log/gaps.log" 2>&1
      { echo "#### gaps"; cat "$log/gaps.log"; } >> "$out/logs.txt"
      tar -C "$out" -czf "$out/traces.tar.gz" traces && rm -rf "$out/traces" ;;
    s37j)  # session 37: rows of 1024 values (500k x 1024, m = 3; every tile reduces a row across warps there), and
           # the fuzz's forced unrolled launches (chunks, exact m) on compiled kernels
      hessian_probe probe-1024 200 s37j_1024 --cases softmax3-1024 mul3-1024 --only "library exact=1" \
        "2x1024/256 w4" "2x1024/256 w4 exact=1" "4x1024/256 w8" "4x1024/256 w8 exact=1" "2x1024/512 w4" \
        "1x1024/512 w4 exact=1"
      run fuzz-small 240 python3 tests/fuzz.py --device cuda --n 40 --seed 38000 --ops mmchain --with small_config
      grep -E "^FAIL|cases passed" "$log/fuzz-small.log" | cut -c1-400 ;;
    s37i)  # session 37, after s37h: the 512-value-row launches as the model's pick, float64 checks
      hessian_probe probe-lib 150 s37i_lib --cases softmax3-512 softmax5-512 mul3-512 xtv5-512 --only
      check_mm s37i ;;
    s37h)  # session 37: rows of 512 values (1M x 512; m <= 4 takes the unrolled kernel unchunked, m = 5 the padded
           # dot), the points sm_90 compiles without spills or layout conversions
      hessian_probe probe-512 300 s37h_512 --cases softmax3-512 softmax5-512 mul3-512 --only \
        "padded dot" "library exact=1" "4x512/128 w4" "8x512/128 w8" "8x512/128 w4" "4x512/128 w4 exact=1" \
        "8x512/128 w4 exact=1" "8x512/128 w8 exact=1" "2x512/256 w4" "2x512/256 w4 exact=1" "4x512/256 w8" \
        "4x512/256 w8 exact=1" ;;
    s37g)  # session 37, after s37f: the 2-byte launches as the model's pick: the library's launch of each bf16 /
           # fp16 form (and the fp32 ones again), float64 checks
      hessian_probe probe-lib 200 s37g_lib --cases softmax5-bf16 softmax3-bf16 mul5-bf16 xtv5-bf16 \
        loss3-bf16 softmax5-fp16 xtv5-fp16 softmax5 mul5 xtv5 --only "padded dot"
      check_mm s37g ;;
    s37f)  # session 37: 2-byte storage on 256-value rows (bf16), the points sm_90 compiles without spills or
           # layout conversions (hessian_probe --compile-only)
      hessian_probe probe-bf16 300 s37f_bf16 --cases softmax5-bf16 softmax3-bf16 mul5-bf16 xtv5-bf16 \
        loss3-bf16 --only "padded dot" "library exact=1" "8x256/128 w4" "16x256/128 w8" "8x256/128 w4 exact=1" \
        "16x256/128 w8 exact=1" "8x256/256 w8 exact=1" "4x256/128 w4 exact=1" "8x256/64 w4 exact=1" \
        "4x256/256 w4 exact=1" ;;
    s37d)  # session 37, after s37c: bench_mmchain's matrix-y case (2M x 128, m = 4, 74 % on the H200) swept on the
           # unrolled kernel; where the 5-class fit's time goes at 2M x 256; the 2M x 256 fits of every estimator
      hessian_probe probe-plain4 200 s37d_plain4 --cases plain4-128 --only "16x128/32 w4 pf1" \
        "16x128/32 w4 pf2" "32x128/32 w8 pf1" "32x128/32 w8 pf2" "16x128/64 w4 pf1" "16x128/64 w4 pf2" "8x128/64 w4 pf1" \
        "8x128/64 w4 pf2" "16x128/64 w8 pf2" "32x128/64 w8 pf1" "16x128/16 w4 pf1"
      run profile-mult 150 python3 benchmarks/profile_fit.py --shape 2000000x256 --algo multinomial \
        --out "$out/profile_fit_mult_s37d.json"
      tail -40 "$log/profile-mult.log" | cut -c1-200
      run e2e-256 400 python3 benchmarks/bench_end_to_end.py --parts large --large 2000000x256 --repeat 3 \
        --sklearn-budget 1 --no-plots --out "$out/end_to_end_2Mx256_s37d.json"
      grep -E "^\| " "$log/e2e-256.log" | cut -c1-200 | tail -16 ;;
    s37c)  # session 37, after s37b: the final 256-value-row rules (softmax m = 6 in chunks of 128, the plain
           # product m <= 4 / 6, the m <= 4 loss pass's one read, X^T V on 512-value rows): the library's launch
           # of each probed form, float64 checks, the solver passes, the 5-class fit beside ops and scikit-learn
      hessian_probe probe-lib 150 s37c_lib --cases softmax5 softmax6 mul3 mul6 loss3 xtv8 xtv5-512 --only
      check_mm s37c
      solver_ops s37c 2000000x256x3 2000000x256x6
      run e2e-mult-wide 200 python3 benchmarks/bench_end_to_end.py --parts large --large 2000000x256 \
        --algorithms logistic-multinomial --repeat 3 --sklearn-budget 1 --no-plots \
        --out "$out/end_to_end_multinomial_2Mx256_s37c.json"
      grep -E "^\| " "$log/e2e-mult-wide.log" | cut -c1-200 | tail -8 ;;
    s37b)  # session 37, after s37: the 256-value-row launches as the model's pick (chunks of 64, 16 values on 4
           # warps, m exact): the library's launch of the probed forms, the forms not yet probed, float64
           # checks, the solver passes and the 5-class fit at 2M x 256 against .ab-base (7703021), interleaved
      hessian_probe probe-lib 120 s37b_lib --cases softmax5 mul5 xtv5 --only
      hessian_probe probe-more 420 s37b --cases softmax6 mul6 mul3 loss5 loss3 xtv8 xtv5-512 --only \
        "padded dot" "library exact=1" "4x256/128 w4" "4x256/64 w4" "8x256/64 w4" "8x256/128 w4" "8x256/128 w8" \
        "16x256/64 w8" "4x256/64 w4 exact=1" "8x256/64 w4 exact=1" "8x256/64 w4 exact=0" "16x256/64 w4 exact=1" \
        "16x256/64 w8 exact=1" "16x256/64 w8 exact=0" "8x256/128 w8 exact=0" "4x512/64 w4 exact=1" \
        "8x512/64 w8 exact=1" "4x512/128 w4 exact=1"
      check_mm s37b
      solver_ops s37b 2000000x256x5 2000000x256x3
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run e2e-$side-$r 200 python3 $root/benchmarks/bench_end_to_end.py --parts large --large 2000000x256 \
            --algorithms logistic-multinomial --repeat 3 --backends fused --no-plots --out "$out/e2e_mult_${side}_$r.json"
          grep -E "^\| " "$log/e2e-$side-$r.log" | cut -c1-200 | tail -3
        done
      done ;;
    s37)  # session 37: the wide-row Hessian passes on the unrolled kernel (column chunks, warps, m exact for
          # X^T V and the plain product), the points sm_90 compiles without spills (hessian_probe --compile-only)
      hessian_probe hessian-probe 420 s37 --cases softmax5 softmax3 xtv5 mul5 --only \
        "padded dot" "library exact=1" "4x256/128 w4" "8x256/64 w4" "8x256/128 w4" "8x256/128 w8" "16x256/64 w8" \
        "16x256/128 w8" "16x256/64 w4" "4x256/128 w4 exact=1" "8x256/128 w8 exact=1" "8x256/64 w8 exact=1" \
        "16x256/64 w8 exact=1" "8x256/64 w4 exact=1" "4x256/32 w4 exact=1" "8x256/256 w8 exact=1" \
        "4x256/128 w4 exact=0" ;;
    s36)  # session 36: a matvec with one register accumulator per right-hand side (matvec_probe); the
          # compile-checked tiles beside the planned ones (tile_ab, with the m = 1 loss tiles that spill on 3.9)
      run matvec-probe 240 python3 benchmarks/matvec_probe.py --out "$out/matvec_probe_s36.json"
      grep -E "^\| [0-9]+ \| [0-9]+ \| [0-9] \| [0-9]" "$log/matvec-probe.log" | cut -c1-260
      run tile-ab 180 python3 benchmarks/tile_ab.py --out "$out/tile_ab_s36.json"
      grep -E "^\| " "$log/tile-ab.log" | cut -c1-220 ;;
    s36c)  # session 36: the matvec's one accumulator per right-hand side as the model's pick (fp32 rows > 128
           # values, m = 2..5): float64 checks of mmchain and loss_gradient, the solver passes at 2M x 256, m = 5 / 3
      check_mm s36c 200
      solver_ops s36c 2000000x256x5 2000000x256x3 ;;
    s36b)  # session 36, after s36: the GMM E-step and mmchain tables (no sweep), the full-covariance fallback tiles
      run gmm 90 python3 benchmarks/bench_gmm.py --out "$out/gmm_s36.json"
      grep -E "^\| [0-9]" "$log/gmm.log" | cut -d"|" -f2-12
      run mmchain 150 python3 benchmarks/bench_mmchain.py --no-sweep --out "$out/mmchain_s36.json"
      grep -E "^\| (dense|csr)" "$log/mmchain.log" | cut -c1-200
      run full-sweep 200 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 14,26,23 --sweep-precisions fp32 \
        --variants '^single BN=' --budget 90 --out "$out/gmm_full_sweep_s36.json"
      grep -E "^\| [0-9]" "$log/full-sweep.log" | cut -c1-200 ;;
    s35c)  # session 35, checks only (a short device budget): the CUDA tests of every module, check_gpu of the
           # operators whose launches changed (mmchain, gmm)
      run cuda-tests 240 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests
      tail -3 "$log/cuda-tests.log"
      run check 240 python3 benchmarks/check_gpu.py --parts mmchain gmm --out "$out/check_gpu_s35c.json"
      grep -E "^FAIL|passed" "$log/check.log" | tail -8 ;;
    s35)  # session 35: s34's timings (the k-means table with and without weights, the weighted tl.dot sweep, the
          # full-covariance fallback tiles under 3.6) and the GPU checks after the direct launches moved to
          # _launch.call and the full sweep's tile to fused.fitted_plan: check_gpu of mmchain, kmeans, gmm, gmm_em,
          # the CUDA tests of every module; the GMM E-step and mmchain tables (no sweep)
      run cuda-tests 300 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests
      tail -3 "$log/cuda-tests.log"
      run check 300 python3 benchmarks/check_gpu.py --parts mmchain kmeans gmm gmm_em --out "$out/check_gpu_s35.json"
      grep -E "^FAIL|passed" "$log/check.log" | tail -8
      run gmm 90 python3 benchmarks/bench_gmm.py --out "$out/gmm_s35.json"
      grep -E "^\| [0-9]" "$log/gmm.log" | cut -d"|" -f2-12
      run mmchain 150 python3 benchmarks/bench_mmchain.py --no-sweep --out "$out/mmchain_s35.json"
      grep -E "^\| (dense|csr)" "$log/mmchain.log" | cut -c1-200
      tile_timings s35 ;;
    s34)  # session 34 (no GPU that session): the tl.dot Lloyd tile chosen from its compile (weighted 64 x 64 fell back
          # from 64 x 4, which spills 6.9 KB on Triton 3.6, to 16 x 4): the k-means table with and without weights and
          # the weighted tl.dot sweep (forced tiles, no fallback) beside it; the full-covariance tiles Triton 3.9 takes
          # (64 x 2, 32 x 2, 32 x 4) timed under the device's 3.6 in the sweep; the GPU checks of both modules
      tile_timings s34
      run check 240 python3 benchmarks/check_gpu.py --parts kmeans gmm gmm_em --out "$out/check_gpu_s34.json"
      grep -E "^FAIL|passed" "$log/check.log" | tail -6
      run cuda-tests 240 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_gmm.py tests/test_kmeans.py \
        tests/test_algorithms_mixture.py
      tail -3 "$log/cuda-tests.log" ;;
    s33j)  # session 33: sample weights and per-row log-likelihoods on the tensor-core GMM E-step: the probe's checks
           # and timings, the CUDA tests of the GMM modules, a fuzz campaign on the GMM E-step
      run probe 200 python3 benchmarks/gmm_mma_probe.py --shapes 1048576x16x16,4194304x16x16 --out "$out/gmm_mma_probe_s33j.json"
      check_counts probe
      grep -E "^\| [0-9]+ \| [0-9]+ \| [0-9]+ \| (model|tf32)" "$log/probe.log"
      run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py
      tail -1 "$log/cuda-tests.log"
      run fuzz 90 python3 tests/fuzz.py --device cuda --n "${FUZZ_N:-40}" --seed "${FUZZ_SEED:-$RANDOM}" --ops gmm_estep
      grep -E "^FAIL|cases passed" "$log/fuzz.log" | cut -c1-400 | tail -8 ;;
    s33e)  # session 33, final GMM code ("auto": the tensor-core E-step from 0.5M rows): the E-step table, the probe,
           # the CUDA tests and float64 checks of the GMM modules
      run gmm 90 python3 benchmarks/bench_gmm.py --out "$out/gmm_s33e.json"
      grep -E "^\| [0-9]" "$log/gmm.log" | cut -d"|" -f2-12
      run probe 200 python3 benchmarks/gmm_mma_probe.py --shapes 524288x16x16,1048576x16x16,4194304x16x16,16777216x16x16 \
        --out "$out/gmm_mma_probe_s33e.json"
      check_counts probe
      grep -E "^\| [0-9]+ \| [0-9]+ \| [0-9]+ \| (model|tf32)" "$log/probe.log"
      run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py tests/test_kmeans.py
      tail -1 "$log/cuda-tests.log"
      run check-gmm 240 python3 benchmarks/check_gpu.py --parts gmm gmm_em --out "$out/check_gpu_gmm_s33e.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -6 ;;
    s33c)  # session 33: the matrix-y mmchain (m <= 4) with X Y on the tensor cores, a prototype beside the library's pick
      run mmc-probe 300 python3 benchmarks/mmchain_mma_probe.py ${MMC_SHAPES:+--shapes $MMC_SHAPES} --out "$out/mmchain_mma_probe_s33c.json"
      check_counts mmc-probe
      grep -E "^\| [0-9]+ \| [0-9]+ \| [0-9]+ \| [a-z]" "$log/mmc-probe.log" ;;
    s33)  # session 33: the tensor-core E-step's operand tiles written by the sweep itself (two launches per E-step, as the
          # register form): the CUDA tests of the GMM modules, the probe from 0.5M to 4M rows with interleaved fits
          # (the row threshold's evidence), a fuzz campaign
      run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py
      tail -3 "$log/cuda-tests.log"
      run probe 300 python3 benchmarks/gmm_mma_probe.py --shapes 524288x16x16,1048576x16x16,2097152x16x16,4194304x16x16 \
        --fit 1048576x16x16,2097152x16x16 --out "$out/gmm_mma_probe_s33.json"
      check_counts probe
      grep -E "^\| [0-9]+ \| [0-9]+ \| [0-9]+ \| (model|tf32|mma WN 4 R 1 P 5|e2e|20 iter)" "$log/probe.log"
      fuzz_cuda 60 "${FUZZ_N:-6}" "${FUZZ_SEED:-$RANDOM}" ;;
    s32)  # session 32: the tensor-core diag E-step (precision "auto" -> tf32x3 at 8 < K, D <= 16): the CUDA tests
          # of the GMM modules, the GMM checks against float64, the E-step table, the probe beside the register
          # form, the GMM fit of .ab-base against this code, a fuzz campaign
      run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py tests/test_kmeans.py
      tail -3 "$log/cuda-tests.log"
      run check-gmm 240 python3 benchmarks/check_gpu.py --parts gmm gmm_em --out "$out/check_gpu_gmm_s32.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -6
      run gmm 90 python3 benchmarks/bench_gmm.py --out "$out/gmm_s32.json"
      grep -E "^\| [0-9]" "$log/gmm.log" | cut -d"|" -f2-12
      run probe 120 python3 benchmarks/gmm_mma_probe.py --shapes 4194304x16x16,1048576x16x16,16777216x16x16 \
        --out "$out/gmm_mma_probe_s32.json"
      grep -E "^\| [0-9]+ \| [0-9]+ \| [0-9]+ \| (model|tf32)" "$log/probe.log"
      gmm_fit_ab
      fuzz_cuda 60 "${FUZZ_N:-6}" "${FUZZ_SEED:-$RANDOM}" ;;
    s31c)  # session 31, third call: the BD = 16, K <= 32 full tile's rows with their errors; the GMM checks
      run full-rows3 150 python3 benchmarks/bench_gmm.py --configs 27,26,23 --out "$out/gmm_full_s31c.json"
      grep -E "^\| [0-9]" "$log/full-rows3.log" | cut -c1-200
      run check-gmm 240 python3 benchmarks/check_gpu.py --parts gmm gmm_em --out "$out/check_gpu_gmm_s31c.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -6
      fuzz_cuda 200 "${FUZZ_N:-0}" "${FUZZ_SEED:-$RANDOM}" ;;
    s31b)  # session 31, second call: the full-covariance pick for BD = 16, K > 16 (64 rows on 2 warps) against
           # the sweep at K = 32 and 64, with its errors; the CUDA tests of the touched modules (the launch-override
           # checks); the GPU fuzz case that failed to compile (mmchain:28268) and its neighbours
      run full-rows2 150 python3 benchmarks/bench_gmm.py --configs 23,26,14 --out "$out/gmm_full_s31b.json"
      grep -E "^\| [0-9]" "$log/full-rows2.log" | cut -c1-200
      run full-sweep2 150 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 26 --sweep-precisions fp32 \
        --variants '^single BN=|^two_pass BN=' --budget 90 --out "$out/gmm_full_sweep_s31b.json"
      grep -E "^\| [0-9]" "$log/full-sweep2.log" | cut -c1-200
      run cuda-tests 240 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_gmm.py \
        tests/test_mmchain_bad_inputs.py tests/test_kmeans.py tests/test_algorithms_mixture.py
      tail -3 "$log/cuda-tests.log"
      run replay 60 python3 tests/fuzz.py --device cuda --case mmchain:28268
      tail -1 "$log/replay.log"
      fuzz_cuda 200 "${FUZZ_N:-12}" "${FUZZ_SEED:-28262}" ;;
    s31)  # session 31: the GMM fit of .ab-base (git archive cdf09d1) against this code; full-covariance tiles
          # the planner picks untimed (BD = 16 with K = 64, padded D = 24 and 28: the model's pick against the
          # sweep); the mmchain table on the current code; a fresh fuzz campaign
      gmm_fit_ab
      run full-sweep 200 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 23,24,25 --sweep-precisions fp32 \
        --variants '^single BN=|^two_pass BN=' --budget 120 --out "$out/gmm_full_sweep_s31.json"
      grep -E "^\| [0-9]" "$log/full-sweep.log" | cut -c1-200
      run full-rows 120 python3 benchmarks/bench_gmm.py --configs 23,24,25,14 --out "$out/gmm_full_s31.json"
      grep -E "^\| [0-9]" "$log/full-rows.log" | cut -c1-200
      run mmchain 90 python3 benchmarks/bench_mmchain.py --max-csr-sweep 3 --out "$out/mmchain.json"
      grep -E "^\| (dense|csr)" "$log/mmchain.log" | cut -c1-160
      fuzz_cuda 150 "${FUZZ_N:-50}" "${FUZZ_SEED:-$RANDOM}" ;;
    s29)  # session 29: sessions 27-28's code on its first GPU (float64 E-step fallbacks, float64 log-likelihood
          # partials, the M-step kernel's Q scalar and the device loop's restart, the tied tile): CUDA tests, the
          # fuzz regressions replayed, the GMM checks, .ab-base (git archive cdf09d1, session 27's end) against
          # this code interleaved (E-step at the model's pick; GMM fit), a fresh fuzz campaign
      run cuda-tests 240 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_gmm.py \
        tests/test_algorithms_mixture.py
      tail -3 "$log/cuda-tests.log"
      run replays 200 python3 tests/fuzz.py --device cuda --case gmm_estep:27329 fit:27510 fit:28678 fit:1169 \
        fit:30036 fit:30436 loss_gradient:28518 loss_gradient:11242
      grep -E "^FAIL|cases passed" "$log/replays.log" | cut -c1-400
      run check-gmm 240 python3 benchmarks/check_gpu.py --parts gmm gmm_em --out "$out/check_gpu_gmm_s29.json"
      grep -E "^FAIL|passed" "$log/check-gmm.log" | tail -6
      for r in ${AB_ROUNDS:-1 2}; do  # AB_ROUNDS=0, FIT_SIDES=none, FUZZ_N=0: skip that step
        [ "$r" = 0 ] && break
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run estep-$side-$r 100 python3 $root/benchmarks/bench_gmm.py --sweep --no-targets --configs ${AB_CONFIGS:-1,19,0,11,12,20,13,14} \
            --variants '^$' --sweep-precisions fp32 --out "$out/gmm_estep_ab_${side}_$r.json"
          grep -E "^\| [0-9]" "$log/estep-$side-$r.log" | cut -c1-160
        done
      done
      gmm_fit_ab
      fuzz_cuda 150 "${FUZZ_N:-50}" "${FUZZ_SEED:-$RANDOM}" ;;
    s27-verify)  # session 27 (its planner and the Tweedie fix were not run on the GPU): the two fuzz cases the
                 # GPU failed, the GMM checks, the full / tied rows, and the tiles left to time
      for c in loss_gradient:28518 loss_gradient:11242; do
        run replay-${c#*:} 60 python3 tests/fuzz.py --device cuda --case $c; tail -1 "$log/replay-${c#*:}.log"
      done
      run check-s27-gmm 240 python3 benchmarks/check_gpu.py --parts gmm --out "$out/check_gpu_gmm_s27.json"
      grep -E "^FAIL|passed" "$log/check-s27-gmm.log" | tail -6
      run gmm-s27 150 python3 benchmarks/bench_gmm.py --configs 11,12,13,14,15,22 --out "$out/gmm_fulltied_s27.json"
      grep "^| [0-9]" "$log/gmm-s27.log" | cut -c1-160
      run s27-sweep 200 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 11,13,14 --sweep-precisions fp32 \
        --variants '^single BN=' --budget 150 --out "$out/gmm_fulltied_sweep_s27.json" ;;
    s27-full)  # session 27: the full-covariance tiles refitted to sm_90 compiles (8 warps; 32 rows with padded
               # features; BD = 64 two-pass in 32-row tiles), .ab-base (git archive ee556fd) against this code,
               # interleaved, then every single / two-pass tile of those shapes
      cp benchmarks/bench_gmm.py .ab-base/benchmarks/bench_gmm.py  # only a configuration added since
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run full-$side-$r 150 python3 $root/benchmarks/bench_gmm.py --configs 13,14,15,22 --out "$out/gmm_full_${side}_$r.json"
          grep -E "full" "$log/full-$side-$r.log" | grep "^|" | cut -c1-200
        done
      done
      run full-sweep 200 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 13,14,15,22 --sweep-precisions fp32 \
        --variants '^single BN=|^two_pass BN=' --budget 150 --out "$out/gmm_full_sweep.json" ;;
    s26-tied)  # session 26 (no GPU that session): the tied single sweep's own kernel (rows whitened once, statistics
               # about each row's own centre; 4M x 16, K = 16 and 1M x 64, K = 32 were 7.1 and 25.7 ms in session 6),
               # .ab-base (git archive ee556fd) against this code, interleaved; the check; its row-block sweep
      run check-s26-gmm 240 python3 benchmarks/check_gpu.py --parts gmm --out "$out/check_gpu_gmm_s26.json"
      grep -E "^FAIL|passed" "$log/check-s26-gmm.log" | tail -6
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run tied-$side-$r 150 python3 $root/benchmarks/bench_gmm.py --configs 11,12 --out "$out/gmm_tied_${side}_$r.json"
          grep -E "tied" "$log/tied-$side-$r.log" | grep "^|" | cut -c1-200
        done
      done
      run tied-sweep 150 python3 benchmarks/bench_gmm.py --sweep --no-targets --configs 11,12 --sweep-precisions fp32 \
        --variants '^single BN=' --budget 100 --out "$out/gmm_tied_sweep.json" ;;
    cuda-tests-rf)  # session 24: the CUDA tests of every module with them, every failure's traceback kept
      run cuda-tests 200 env TRITON_INTERPRET=0 python3 -m pytest -q -rfE -k cuda tests/test_streaming.py \
        tests/test_algorithms_base.py tests/test_gmm.py tests/test_algorithms_mixture.py tests/test_kmeans.py
      tail -3 "$log/cuda-tests.log" ;;
    gmm-fit-ab)  # session 23: the GMM fit of .ab-base (session start) against this code, interleaved, fused and
                 # ops, 5 fits each; the fit's phases (host probe) on this code
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run gmm-fit-$side-$r 100 python3 $root/benchmarks/bench_end_to_end.py --parts gmm --repeat 5 \
            --backends fused ops --no-plots --out "$out/end_to_end_gmm_ab_${side}_$r.json"
          grep -E "^\| synthetic" "$log/gmm-fit-$side-$r.log" | cut -d"|" -f2-6
        done
      done
      run gmm-fit-probe 90 python3 benchmarks/gmm_host_probe.py --shapes 1048576x16x16 --out "$out/gmm_host_probe.json"
      grep -A3 "phases" "$log/gmm-fit-probe.log" | head -8 ;;
    gmm-host-ab)  # session 23: the E-step's host arithmetic without triton.cdiv's JIT calls: the 1M-row data
                  # passes of .ab-base and this code interleaved; this code's host probe
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run gmm-host-$side-$r 60 python3 $root/benchmarks/bench_gmm.py --sweep --no-targets --configs 0,18,19 \
            --variants '^$' --sweep-precisions fp32 --out "$out/gmm_host_ab_${side}_$r.json"
          grep -E "^\| [0-9]" "$log/gmm-host-$side-$r.log"
        done
      done
      run gmm-host-probe 90 python3 benchmarks/gmm_host_probe.py --shapes 1048576x2x2 1048576x16x16 --fit '' \
        --out "$out/gmm_host_probe.json"
      grep -E "host_us|kernel_ms|call_ms" "$log/gmm-host-probe.log" | head -12 ;;
    ab-e2e)  # session 22: the dense fits of the code in .ab-base (a checkout of an earlier commit) against
             # this code, interleaved base / new / base / new on one machine start (fused and ops)
      for r in 1 2; do
        for side in base new; do
          root=.; [ $side = base ] && root=.ab-base
          run e2e-ab-$side-$r 200 python3 $root/benchmarks/bench_end_to_end.py --parts dense large --large 4000000x64 \
            --repeat 5 --backends fused ops --no-plots --out "$out/end_to_end_ab_${side}_$r.json"
          tail -16 "$log/e2e-ab-$side-$r.log" | grep -E "^\| synthetic" | cut -c1-150
        done
      done ;;
    profile-big) run profile-big 150 python3 benchmarks/profile_fit.py --shape 4000000x64 --algo logistic \
                   --algo poisson --cprofile 45 --out "$out/profile_fit_big.json" ;;
    profile-gmm) run profile-gmm 120 python3 benchmarks/profile_fit.py --shape 1000000x16 --algo gmm \
                   --cprofile 30 --out "$out/profile_fit_gmm.json" ;;
    distributed) run distributed 90 python3 benchmarks/bench_distributed.py --gpus 1 2 4 --out "$out/distributed.json" ;;
  esac
done
for p in $parts; do tail -n 22 "$log/$p.log" 2>/dev/null | grep "^|" ; done
