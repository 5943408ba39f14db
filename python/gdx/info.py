"""``python -m gdx.info``: what this build of gdx and this machine offer — version, transports, GPUs, NICs, NUMA
placement. Reads sysfs and the extension only; joins no job."""

import os
import pathlib

from . import _gdx


def _read(path: pathlib.Path, default: str = "?") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def gpus():
    """(index, name, bus id, NUMA node) of the CUDA GPUs torch sees; [] without torch or CUDA."""
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            bus = None
            numa = "?"
            if hasattr(p, "pci_bus_id"):
                bus = f"{getattr(p, 'pci_domain_id', 0):04x}:{p.pci_bus_id:02x}:{getattr(p, 'pci_device_id', 0):02x}.0"
                numa = _read(pathlib.Path("/sys/bus/pci/devices") / bus / "numa_node")
            out.append((i, p.name, bus, numa))
        return out
    except Exception:  # torch missing or broken: report no GPUs rather than fail
        return []


def nics():
    """(name, ports' states, NUMA node) of every RDMA device in sysfs."""
    root = pathlib.Path("/sys/class/infiniband")
    out = []
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        ports = sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []
        states = ", ".join(f"port {p.name} {_read(p / 'state')}" for p in ports)
        out.append((dev.name, states, _read(dev / "device" / "numa_node")))
    return out


def numa_nodes():
    root = pathlib.Path("/sys/devices/system/node")
    return [(n.name, _read(n / "cpulist")) for n in sorted(root.glob("node[0-9]*"))]


def main() -> None:
    print(f"gdx {_gdx.__version__} ({pathlib.Path(_gdx.__file__).parent})")
    print(f"transports: tcp, loopback{', verbs' if nics() else ''} (GDX_TRANSPORT={os.environ.get('GDX_TRANSPORT', 'tcp')})")
    print(f"MoE layer (gdx.ep): {'built' if _gdx.ep_available() else 'not built (no CUDA at build time)'}")
    g = gpus()
    print(f"GPUs: {len(g)}")
    for i, name, bus, numa in g:
        print(f"  {i}: {name}, PCI {bus}, NUMA node {numa}")
    n = nics()
    print(f"RDMA devices: {len(n)}")
    for name, states, numa in n:
        print(f"  {name}: {states}, NUMA node {numa}")
    print("NUMA nodes:")
    for name, cpus in numa_nodes():
        print(f"  {name}: CPUs {cpus}")


if __name__ == "__main__":
    main()
