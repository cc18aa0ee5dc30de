"""Can this process use the GPUs the machine has? NVML's view against torch.cuda's.

NVML (the driver's library, what nvidia-smi shows) lists every GPU in the machine: it ignores
``CUDA_VISIBLE_DEVICES``, MIG and SLURM's cgroup device limits. torch.cuda shows what the
CUDA runtime can use. Comparing the two tells three situations apart:

* ``usable``: torch sees the GPUs it should (their UUIDs match NVML's);
* ``hidden`` / ``no-gpu``: no GPU, or GPUs hidden on purpose (``CUDA_VISIBLE_DEVICES``, a SLURM
  job without GPUs, MIG mode): a CPU run is right, tests skip with the reason;
* ``broken``: NVML sees GPUs nobody hid, but torch cannot use them (driver too old for the
  wheel's CUDA, a CPU-only torch build, a GPU older than the build supports). Everything would
  quietly run on the CPU; ``make setup GPU=1`` and the GPU tests fail with the message.

Command line (``make setup GPU=1`` and ``make gpu-check`` call it)::

    python -m helpers.core.gpu_visibility             # prints the verdict; exit 1 only if broken
    python -m helpers.core.gpu_visibility --require   # exit 1 unless a GPU is usable
    python -m helpers.core.gpu_visibility --json      # the result as JSON

It never raises for a missing driver or NVML, and it initialises CUDA only when NVML has
found a GPU that should be visible (then it reads each device's UUID). A GPU NVML counts but
cannot open (``NO_PERMISSION`` for the GPUs a SLURM job's cgroup hides) is left out, and
named in the message and in ``details["unreadable"]``; the others are judged as usual.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from .fmt import ShownAsTable
from .nvml import plain_uuid

__all__ = ["GpuVisibility", "NvmlGpu", "gpu_visibility", "USABLE", "HIDDEN", "NO_GPU", "BROKEN",
           "CUDA_DRIVER_FLOOR"]

USABLE, HIDDEN, NO_GPU, BROKEN = "usable", "hidden", "no-gpu", "broken"
# the oldest driver branch that runs each CUDA major (CUDA's release notes, minor compat)
CUDA_DRIVER_FLOOR = {11: 450, 12: 525, 13: 580}
DEFAULT_CC_FLOOR = (7, 5)  # torch 2.13's CUDA 13 wheel: Turing and newer


@dataclass(frozen=True)
class NvmlGpu:
    """One physical GPU as NVML reports it."""

    index: int
    name: str
    uuid: str
    compute_capability: tuple[int, int] | None = None
    mig: bool = False


@dataclass(frozen=True, repr=False)
class GpuVisibility(ShownAsTable):
    """The verdict of :func:`gpu_visibility`; ``message`` says why, and what to do if broken."""

    verdict: str
    message: str
    nvml_gpus: tuple[NvmlGpu, ...] = ()
    torch_uuids: tuple[str, ...] = ()
    driver: str | None = None
    torch_cuda: str | None = None
    expected: int = 0  # GPUs this process should see (after deliberate hiding)
    details: dict = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return self.verdict == USABLE

    @property
    def broken(self) -> bool:
        return self.verdict == BROKEN

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        return f"GPU visibility: {self.verdict.upper()}: {self.message}"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_view(nvml) -> tuple[list[NvmlGpu], str | None, int | None, str | None, list[str]]:
    """(GPUs, driver version, CUDA version the driver supports (e.g. 12080), error, the GPUs
    NVML counts but could not read).

    A GPU whose handle, name or UUID raises is left out and named in the last item, and the
    others are still listed: on a node shared by SLURM jobs, ``nvmlDeviceGetCount`` counts
    every GPU, but ``nvmlDeviceGetHandleByIndex`` raises NO_PERMISSION for those the job's
    cgroup hides.
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return ([], None, None, "no NVIDIA driver bindings (nvidia-ml-py is not installed)",
                    [])
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], None, None, f"no NVIDIA driver (NVML could not start: {exc})", []
    try:
        driver = _call(nvml, "nvmlSystemGetDriverVersion")
        cuda_version = _call(nvml, "nvmlSystemGetCudaDriverVersion")
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return [], None, None, (f"NVML failed while counting GPUs ({type(exc).__name__}: "
                                    f"{exc})"), []
        gpus, unreadable = [], []
        for i in range(count):
            try:  # NO_PERMISSION (hidden by a cgroup), a GPU that fell off the bus, ...
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = _text(nvml.nvmlDeviceGetName(handle))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception as exc:
                unreadable.append(f"GPU {i}: {type(exc).__name__}: {exc}")
                continue
            cc = _call(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
            mig = _call(nvml, "nvmlDeviceGetMigMode", handle)
            try:
                cc = tuple(int(v) for v in cc) if cc else None
                mig = bool(mig and int(mig[0]) == 1)
            except (TypeError, ValueError, IndexError):  # an odd binding: not known
                cc, mig = None, False
            gpus.append(NvmlGpu(index=i, name=name, uuid=uuid, compute_capability=cc,
                                mig=mig))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, (_text(driver) if driver else None), cuda_version, None, unreadable


def _call(nvml, name, *args):
    """An NVML call that old drivers may lack: None instead of an exception."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None


def _deliberately_visible(gpus: list[NvmlGpu], env: Mapping[str, str]) -> tuple[int, str]:
    """How many GPUs this process should see, and the reason when some are hidden."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    plain = [g for g in gpus if not g.mig]
    if cvd is not None:
        entries = [e.strip() for e in cvd.split(",")] if cvd.strip() else []
        uuids = {plain_uuid(g.uuid) for g in gpus}
        n = 0
        for entry in entries:  # CUDA stops at the first entry it cannot parse
            if entry.isdigit() and int(entry) < len(gpus):
                n += 1
            elif entry.lower().startswith("mig-"):
                n += 1
            elif entry.lower().startswith("gpu-") and any(
                    u.startswith(plain_uuid(entry)) for u in uuids):
                n += 1
            else:
                break
        if n == 0:
            return 0, (f"CUDA_VISIBLE_DEVICES={cvd!r} hides all {len(gpus)} GPU(s) on purpose; "
                       "unset it to use them")
        return n, f"CUDA_VISIBLE_DEVICES={cvd!r} selects {n} of {len(gpus)} GPU(s)"
    if env.get("SLURM_JOB_ID"):
        gres = (env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
                or env.get("SLURM_GPUS_ON_NODE") or "")
        if gres.strip() in ("", "0"):
            return 0, (f"SLURM job {env['SLURM_JOB_ID']} has no GPUs (its cgroup hides the "
                       f"{len(gpus)} GPU(s) NVML lists); request them with --gpus or --gres=gpu")
    if gpus and not plain:
        return 0, (f"all {len(gpus)} GPU(s) are in MIG mode: CUDA shows MIG instances only "
                   "when CUDA_VISIBLE_DEVICES names them (MIG-<uuid>, see nvidia-smi -L)")
    if len(plain) < len(gpus):
        return len(plain), f"{len(gpus) - len(plain)} GPU(s) in MIG mode are not counted"
    return len(gpus), ""


def _cc_floor(torch) -> tuple[int, int]:
    """The oldest compute capability the torch build has kernels for (sm_XX in its arch list)."""
    try:
        archs = [a for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
        caps = [(int(a[3:-1]), int(a[-1])) for a in archs if a[3:].isdigit()]
        return min(caps) if caps else DEFAULT_CC_FLOOR
    except Exception:
        return DEFAULT_CC_FLOOR


def _too_old(torch, gpus: list[tuple[str, tuple[int, int]]]) -> str:
    """The message for the first (name, compute capability) this torch build has no kernels
    for, or ""."""
    floor = _cc_floor(torch)
    for name, (major, minor) in gpus:
        if (major, minor) < floor:
            return (f"{name} has compute capability {major}.{minor}, below the "
                    f"{floor[0]}.{floor[1]} this torch build (CUDA {torch.version.cuda}) has "
                    "kernels for: use a newer GPU or a torch built for an older CUDA")
    return ""


def _broken_cause(torch, gpus, driver, cuda_driver_version) -> str:
    """The likely cause, and the fix, when torch cannot use GPUs that NVML sees."""
    names = ", ".join(sorted({g.name for g in gpus}))
    torch_cuda = torch.version.cuda
    if torch_cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build, but NVML sees {names}. "
                "Install the CUDA build: make setup GPU=1 (it forces the reinstall)")
    major = int(str(torch_cuda).split(".")[0])
    floor = CUDA_DRIVER_FLOOR.get(major)
    driver_major = int(driver.split(".")[0]) if driver and driver[0].isdigit() else None
    too_old = (cuda_driver_version is not None and cuda_driver_version // 1000 < major) or (
        floor is not None and driver_major is not None and driver_major < floor)
    if too_old:
        return (f"NVIDIA driver {driver} is too old for torch {torch.__version__} (CUDA "
                f"{torch_cuda} needs driver >= {floor}): update the driver, or use a torch "
                "built for an older CUDA (README, GPU section)")
    old = _too_old(torch, [(g.name, g.compute_capability) for g in gpus
                           if g.compute_capability])
    if old:
        return old
    return (f"NVML sees {names} (driver {driver}) but torch {torch.__version__} (CUDA "
            f"{torch_cuda}) cannot use it: check `nvidia-smi`, the device files (/dev/nvidia*) "
            "and that the container was started with GPU access")


def gpu_visibility(*, nvml=None, environ: Mapping[str, str] | None = None) -> GpuVisibility:
    """Compare the GPUs NVML sees with those torch.cuda exposes.

    Args:
        nvml: the NVML binding (default: ``import pynvml``); tests pass a fake module.
        environ: the environment to read CUDA_VISIBLE_DEVICES / SLURM_* from (default
            ``os.environ``).

    Returns:
        A :class:`GpuVisibility` with ``verdict`` "usable", "hidden", "no-gpu" or "broken" and
        a ``message`` naming the reason (and, when broken, the likely cause and the fix).
    """
    env = os.environ if environ is None else environ
    if not isinstance(env, Mapping):
        raise TypeError(f"environ must be a mapping, got {type(env).__name__}")
    gpus, driver, cuda_driver_version, error, unreadable = _nvml_view(nvml)
    if error is not None:
        return GpuVisibility(NO_GPU, error, nvml_gpus=tuple(gpus), driver=driver)
    if not gpus and unreadable:
        return GpuVisibility(NO_GPU, f"NVML (driver {driver}) counts {len(unreadable)} GPU(s) "
                                     f"but could read none of them ({'; '.join(unreadable)})",
                             driver=driver, details={"unreadable": unreadable})
    result = _verdict(gpus, driver, cuda_driver_version, env)
    if not unreadable:
        return result
    note = (f"; {len(unreadable)} GPU(s) NVML counts could not be read and are left out "
            f"({'; '.join(unreadable)}); a GPU refused with NO_PERMISSION is usually another "
            "job's, hidden by this job's cgroup")
    return replace(result, message=result.message + note,
                   details={**result.details, "unreadable": unreadable})


def _verdict(gpus: list[NvmlGpu], driver: str | None, cuda_driver_version: int | None,
             env: Mapping[str, str]) -> GpuVisibility:
    """The verdict for the GPUs NVML could read."""
    common = {"nvml_gpus": tuple(gpus), "driver": driver}
    if not gpus:
        return GpuVisibility(NO_GPU, f"NVML (driver {driver}) lists no GPU", **common)
    expected, why = _deliberately_visible(gpus, env)
    if expected == 0:
        return GpuVisibility(HIDDEN, why, **common)
    try:
        import torch
    except ImportError:
        return GpuVisibility(BROKEN, "torch is not installed (make setup GPU=1)", **common,
                             expected=expected)
    common["torch_cuda"] = torch.version.cuda
    if torch.version.cuda is None or not torch.cuda.is_available():
        cause = _broken_cause(torch, gpus, driver, cuda_driver_version)
        return GpuVisibility(BROKEN, f"torch.cuda.is_available() is False: {cause}", **common,
                             expected=expected)
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    uuids = tuple(plain_uuid(str(p.uuid)) for p in props)
    common.update(torch_uuids=uuids, expected=expected)
    if len(props) < expected:
        cause = _broken_cause(torch, gpus, driver, cuda_driver_version)
        return GpuVisibility(BROKEN, f"torch sees {len(props)} of the {expected} GPU(s) it "
                                     f"should ({why or 'none hidden on purpose'}): {cause}",
                             **common)
    if env.get("CUDA_VISIBLE_DEVICES") is None:  # every plain GPU should be there, by UUID
        missing = [g for g in gpus if not g.mig and plain_uuid(g.uuid) not in uuids]
        if missing:
            return GpuVisibility(BROKEN, "torch does not see " + ", ".join(
                f"GPU {g.index} ({g.name}, {g.uuid})" for g in missing) + ": " +
                _broken_cause(torch, missing, driver, cuda_driver_version), **common)
    old = _too_old(torch, [(p.name, (p.major, p.minor)) for p in props])
    if old:
        return GpuVisibility(BROKEN, old, **common)
    names = ", ".join(p.name for p in props)
    note = f" ({why})" if why else ""
    return GpuVisibility(USABLE, f"torch sees {len(props)} GPU(s): {names}; driver {driver}, "
                                 f"CUDA {torch.version.cuda}{note}", **common)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.core.gpu_visibility",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--require", action="store_true",
                        help="exit 1 unless a GPU is usable (default: only when broken)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = gpu_visibility()
    print(json.dumps(result.as_dict(), indent=1) if args.json else str(result))
    if result.broken or (args.require and not result.usable):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
