# Runs inside the Soft-RoCE guest (tests/softroce/run-in-vm.sh --script): the ring exchange over verbs, two ranks
# on rxe0 (GID index 1: RoCE v2 on the VM's 10.0.2.15), started by run_ranks.sh like on any host.
export GDX_TRANSPORT=verbs GDX_IB_GID_INDEX=1 GDX_MASTER_ADDR=127.0.0.1 GDX_MASTER_PORT=29500 GDX_LOG_LEVEL=INFO
sh /opt/test/run_ranks.sh 2 example_ring_exchange 4M
