set -u
REPO=$PWD
DIRMULT_GPU_TESTS="tests/test_sparse.py" bash scripts/gpu/gpu_check.sh wheel test > $OUT/gc.log 2>&1
tail -5 $OUT/gc.log; grep -E "passed|failed|FAILED|Error" $OUT/test.log | tail -8
cd /tmp/dirmult_gpu && export PYTHONPATH=/tmp/dirmult_gpu/site
timeout 150 python3 -m dirmult_ext.bench --sparse --markdown --json $OUT/bench_sparse.json > $OUT/bench_sparse.log 2>&1; tail -20 $OUT/bench_sparse.log
timeout 100 python3 -m dirmult_ext.bench --sparse --timing graph --markdown --quiet > $OUT/bench_sparse_graph.log 2>&1; tail -12 $OUT/bench_sparse_graph.log
timeout 120 ncu --clock-control none -k "regex:regression_" --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python3 $REPO/scripts/gpu/profile_regression_kernels.py > $OUT/ncu_reg.log 2>&1; grep -E "regression_|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Issue Slots Busy|Executed Ipc" $OUT/ncu_reg.log | head -60
timeout 120 ncu --clock-control none -k "regex:csr_" --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats python3 $REPO/scripts/gpu/profile_csr_kernels.py > $OUT/ncu_csr.log 2>&1; grep -E "csr_|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|L2 Hit" $OUT/ncu_csr.log | head -90
