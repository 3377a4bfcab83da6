"""Part: workloads (ground floor). The built-in workloads and their presets, without importing torch.

The trainer runs them, the simulator's performance model prices them, and the control plane and
studies name them; all four read this one list, so it sits below them all. The control plane
(which runs on GPU nodes that may not have torch) reads it to decide which probe commands it may
accept: an agent never runs anything that is not named here.
"""

from __future__ import annotations

from dataclasses import dataclass

SIZES = ("tiny", "full")


@dataclass(frozen=True)
class WorkloadSpec:
    """What the trainer and a simulated GPU need to know about one workload.

    ``steady_util_pct`` is the GPU utilization the workload holds in its steady phase, and
    ``warmup_util_pct`` the one during warm-up (kernels compile, caches fill, clocks settle): the
    trainer drives a simulated GPU with these figures. ``activation_bytes_per_sample`` is a plausible
    per-sample activation footprint of the full-size model in bf16 (used for the simulated GPU's
    memory figure only).
    """

    name: str
    description: str
    needs_torch: bool
    default_batch: dict[str, int]  # size -> samples per step
    sweep: dict[str, tuple[int, ...]]  # size -> batch sizes of `--sweep`
    steady_util_pct: float
    warmup_util_pct: float
    activation_bytes_per_sample: int
    sample_unit: str  # what one "sample" is, for the docs and the summary


_MIB = 1024**2

WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            name="resnet50",
            description="torchvision ResNet-50 v1.5 image classification (224x224, 1000 classes; tiny: 32x32)",
            needs_torch=True,
            default_batch={"tiny": 8, "full": 64},
            sweep={"tiny": (4, 8, 16), "full": (32, 64, 128, 256)},
            steady_util_pct=93.0,
            warmup_util_pct=70.0,
            activation_bytes_per_sample=110 * _MIB,
            sample_unit="image",
        ),
        WorkloadSpec(
            name="bert-base",
            description="BERT-base pre-training (masked LM + next sentence, sequence 128; tiny: 2 layers)",
            needs_torch=True,
            default_batch={"tiny": 8, "full": 32},
            sweep={"tiny": (4, 8, 16), "full": (16, 32, 64, 128)},
            steady_util_pct=96.0,
            warmup_util_pct=75.0,
            activation_bytes_per_sample=90 * _MIB,
            sample_unit="sequence",
        ),
        WorkloadSpec(
            name="gpt",
            description="GPT-2 small style decoder, causal LM (sequence 1024; tiny: 2 layers, sequence 64)",
            needs_torch=True,
            default_batch={"tiny": 8, "full": 8},
            sweep={"tiny": (4, 8, 16), "full": (4, 8, 16, 32)},
            steady_util_pct=97.0,
            warmup_util_pct=75.0,
            activation_bytes_per_sample=700 * _MIB,
            sample_unit="sequence",
        ),
        WorkloadSpec(
            name="matmul-burn",
            description="sustained large GEMMs (4 square layers of 8192, forward and backward) up to the power limit",
            needs_torch=True,
            default_batch={"tiny": 64, "full": 8192},
            sweep={"tiny": (32, 64, 128), "full": (4096, 8192, 16384)},
            steady_util_pct=100.0,
            warmup_util_pct=90.0,
            activation_bytes_per_sample=64 * 1024,
            sample_unit="row",
        ),
        WorkloadSpec(
            name="idle",
            description="no work at all: the GPU's idle power and temperature through the same phases",
            needs_torch=False,
            default_batch={"tiny": 1, "full": 1},
            sweep={"tiny": (1,), "full": (1,)},
            steady_util_pct=0.0,
            warmup_util_pct=0.0,
            activation_bytes_per_sample=0,
            sample_unit="-",
        ),
    )
}

WORKLOAD_NAMES: tuple[str, ...] = tuple(WORKLOADS)

# Phase defaults, in s (docs/trainer.md, "Phases": idle baseline 30 s, cool-down 60 s).
DEFAULT_IDLE_BASELINE_S = 30.0
DEFAULT_WARMUP_S = 10.0
DEFAULT_DURATION_S = 60.0
DEFAULT_COOLDOWN_S = 60.0


def torch_available() -> bool:
    """True when torch, torchvision and transformers can be imported (the `trainer` extra)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("torch", "torchvision", "transformers"))


def runnable_workloads() -> list[str]:
    """The workloads this installation can run: all of them with the `trainer` extra, else `idle`."""
    have_torch = torch_available()
    return [name for name, spec in WORKLOADS.items() if have_torch or not spec.needs_torch]


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``64`` or a sweep ``8,16,32`` (positive integers, no repeats)."""
    try:
        sizes = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise ValueError(f"batch size must be a positive integer or a list such as 8,16,32, not {text!r}") from None
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"batch sizes must be positive integers, not {text!r}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"batch size {text!r} repeats a value")
    return sizes
