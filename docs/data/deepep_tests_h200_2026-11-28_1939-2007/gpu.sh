#!/bin/bash
# usage: bash .deepep/gpu.sh a|b   (device runs; logs into $OUT/logs.tar.gz and $OUT/summary.txt)
STAGE=$1
ROOT=$PWD; PY=/opt/torch/.venv/bin/python3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
L=$ROOT/gpu_logs; mkdir -p $L; S=$L/summary.txt
T0=$(date +%s)
step() { echo "=== [+$(( $(date +%s) - T0 ))s $(date -u +%H:%M:%S)] $*" | tee -a $S; }
finish() { cd $ROOT; tar czf $OUT/logs.tar.gz -C $ROOT gpu_logs; cp $S $OUT/summary.txt; }
trap finish EXIT
nvidia-smi -L | tee -a $S; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | tee -a $S
NGPU=$(nvidia-smi -L | wc -l)
$PY -c 'import torch; print("torch", torch.__version__)' | tee -a $S
step build
GDX_NO_APT=1 make all BUILD=build-gpu JOBS=$(nproc) PYTHON=$PY > $L/build.log 2>&1; echo "build rc $?" | tee -a $S
tail -5 $L/build.log >> $S
xz -dc .deepep/deep_ep_cpp.so.xz > .deepep/src/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so
GDXP=$ROOT/.deepep/shim:$ROOT/build-gpu/python
GDXE=$ROOT/.deepep/shim_early:$ROOT/build-gpu/python
DEP=$ROOT/.deepep/src
PORT=29600
dp() {  # name pythonpath timeout gpus args...
  local name=$1 pp=$2 to=$3 gpus=$4; shift 4; PORT=$((PORT+7))
  step "$name: $*"
  (cd $ROOT/.deepep/src/tests && CUDA_VISIBLE_DEVICES=$gpus MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT PYTHONPATH=$pp timeout $to $PY "$@") > $L/$name.txt 2>&1
  echo "rc $?" | tee -a $S
  grep -E "avg_t|send/recv|Best|Error|error|Traceback|WARN|passed|Testing with seed|Assertion" $L/$name.txt | sort | uniq -c | sort -rn | head -30 >> $S
}
if [ "$STAGE" = a ]; then
  dp ll_gdx "$GDXP" 150 0,1 test_low_latency.py --num-processes 2
  dp ll_gdx_early "$GDXE" 150 0,1 test_low_latency.py --num-processes 2
  dp ll_deepep "$DEP" 150 0,1 test_low_latency.py --num-processes 2
  step "host time gdx"; (CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$GDXP timeout 90 $PY .deepep/hosttime.py) > $L/host_gdx.txt 2>&1; echo rc $? >> $S; grep "\[host\]" $L/host_gdx.txt | sort -u >> $S
  step "host time deepep"; (CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$DEP timeout 90 $PY .deepep/hosttime.py) > $L/host_deepep.txt 2>&1; echo rc $? >> $S; grep "\[host\]" $L/host_deepep.txt | sort -u >> $S
  dp ll_gdx_shrink "$GDXP" 150 0,1 test_low_latency.py --num-processes 2 --shrink-test
  dp intra_gdx "$GDXP" 200 0,1 test_intranode.py --num-processes 2
  dp intra_deepep "$DEP" 200 0,1 test_intranode.py --num-processes 2
  if [ $NGPU -ge 4 ]; then
    dp intra4_gdx "$GDXP" 200 0,1,2,3 test_intranode.py --num-processes 4
    dp intra4_deepep "$DEP" 200 0,1,2,3 test_intranode.py --num-processes 4
  fi
  step "benchmark_moe ll 288 (next kernel at end, then early)"
  CUDA_VISIBLE_DEVICES=0,1 timeout 120 build-gpu/benchmarks/benchmark_moe --mode ll --tokens 128 --no-nccl > $L/bm_ll.txt 2>&1; echo rc $? >> $S; grep -A8 "low-latency (" $L/bm_ll.txt >> $S
  CUDA_VISIBLE_DEVICES=0,1 timeout 120 build-gpu/benchmarks/benchmark_moe --mode ll --tokens 128 --no-nccl --next-kernel-early > $L/bm_ll_early.txt 2>&1; echo rc $? >> $S; grep -A8 "low-latency (" $L/bm_ll_early.txt >> $S
  step "benchmark_moe normal 2 GPUs, then gdx.bench.ep"
  CUDA_VISIBLE_DEVICES=0,1 timeout 150 build-gpu/benchmarks/benchmark_moe --no-nccl --json $L/bm_normal.json > $L/bm_normal.txt 2>&1; echo rc $? >> $S; cat $L/bm_normal.txt | tail -25 >> $S
  (cd build-gpu/python && CUDA_VISIBLE_DEVICES=0,1 timeout 150 $PY -m gdx.bench.ep --no-nccl --json $L/py_ep.json) > $L/py_ep.txt 2>&1; echo rc $? >> $S; tail -25 $L/py_ep.txt >> $S
fi
if [ "$STAGE" = b ]; then
  step "benchmark_moe normal 128,256 then gdx.bench.ep"
  CUDA_VISIBLE_DEVICES=0,1 timeout 60 build-gpu/benchmarks/benchmark_moe --no-nccl --tokens 128,256 > $L/bm_normal_small.txt 2>&1; echo rc $? >> $S; grep -A8 "tokens  dtype" $L/bm_normal_small.txt >> $S
  (cd build-gpu/python && CUDA_VISIBLE_DEVICES=0,1 timeout 60 $PY -m gdx.bench.ep --no-nccl --tokens 128,256) > $L/py_ep_small.txt 2>&1; echo rc $? >> $S; grep "avg_t" $L/py_ep_small.txt >> $S
  dp intra_gdx "$GDXP" 200 0,1 test_intranode.py --num-processes 2
  step "ctest gpu|py"
  (cd build-gpu && CUDA_VISIBLE_DEVICES=0,1 timeout 360 ctest -L "gpu|py" --output-on-failure -j1) > $L/ctest.txt 2>&1; echo "ctest rc $?" | tee -a $S
  grep -E "tests passed|Failed|\*\*\*|Timeout|Not Run" $L/ctest.txt >> $S
  step "benchmark_tcpx --device gpu"
  CUDA_VISIBLE_DEVICES=0,1 timeout 30 build-gpu/benchmarks/benchmark_tcpx --device gpu --no-iperf3 > $L/tcpx_gpu.txt 2>&1; echo rc $? >> $S; tail -12 $L/tcpx_gpu.txt >> $S
  dp ll_gdx_pressure "$GDXP" 45 0,1 test_low_latency.py --num-processes 2 --pressure-test
fi
if [ "$STAGE" = c ]; then
  step "ctest pip_install and examples"
  (cd build-gpu && CUDA_VISIBLE_DEVICES=0,1 timeout 300 ctest -R "pip_install|example_" --output-on-failure -j1) > $L/ctest_c.txt 2>&1; echo "ctest rc $?" | tee -a $S
  grep -E "tests passed|Passed|Failed|\*\*\*|Timeout|Not Run|pip_install:" $L/ctest_c.txt >> $S
  dp ll_gdx "$GDXP" 100 0,1 test_low_latency.py --num-processes 2
  dp ll_deepep "$DEP" 100 0,1 test_low_latency.py --num-processes 2
  step "host time gdx"; (CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$GDXP timeout 60 $PY .deepep/hosttime.py) > $L/host_gdx.txt 2>&1; echo rc $? >> $S; grep "\[host\]" $L/host_gdx.txt | sort -u >> $S
  step "host time deepep"; (CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$DEP timeout 60 $PY .deepep/hosttime.py) > $L/host_deepep.txt 2>&1; echo rc $? >> $S; grep "\[host\]" $L/host_deepep.txt | sort -u >> $S
fi
step done
