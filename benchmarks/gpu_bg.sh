#!/usr/bin/env bash
# Runs gpu_session.sh in its own process session so that one batch can outlast the device tool's
# 10-minute call limit; later calls (within the machine's idle window) wait on it and bring back
# what it has written so far.
#   bash benchmarks/gpu_bg.sh start PART...   copy the tree to /tmp/fusedml-bg, launch, return
#   bash benchmarks/gpu_bg.sh wait SECONDS    wait until done or SECONDS, pack results into $OUT
set -uo pipefail
root=/tmp/fusedml-bg; res=$root/results; logs=$root/logs
case ${1:?usage: gpu_bg.sh start PART... | wait SECONDS} in
  start)
    shift
    rm -rf "$root"; mkdir -p "$root/tree" "$res" "$logs"
    cp -r . "$root/tree"  # later calls re-copy the working tree; the batch reads its own copy
    cd "$root/tree" || exit 1
    LOGDIR=$logs setsid nohup bash -c "bash benchmarks/gpu_session.sh $res $* > $root/session.txt 2>&1; touch $root/done" \
      > /dev/null 2>&1 < /dev/null &
    sleep 2; echo "started: $*" ;;
  wait)
    t0=$SECONDS
    while [ ! -e "$root/done" ] && [ $((SECONDS - t0)) -lt "${2:?seconds}" ]; do sleep 5; done
    [ -e "$root/done" ] && echo "DONE" || echo "RUNNING"
    cat "$root/session.txt"
    tar -czf "${OUT:?}/results.tgz" -C "$root" results logs session.txt ;;
esac
