"""Part: trainer. The per-sample training costs of the trainer's workloads, counted from its real models.

``python -m gpuprobe.trainer.costs`` recomputes the simulator's cache (``sim/workload_costs.json``,
read by :mod:`gpuprobe.sim.perf`) from the models of :mod:`gpuprobe.trainer.models` (needs torch:
the `trainer` extra). It lives in the trainer, not the simulator, so that the simulator, which the
trainer drives, never imports the trainer (docs/architecture.md, "Allowed imports").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from gpuprobe.sim.perf import (
    CALIBRATION_CONFIGS,
    COSTS_PATH,
    FLOAT_BYTES,
    PARAM_BYTES_PER_STEP,
    REGENERATE_COMMAND,
    _cache,
)
from gpuprobe.workloads import SIZES, WORKLOADS

# Operations that launch no kernel on a GPU: allocations, host reads of a scalar, views in all but
# name (besides the real views and the profiler's marks).
_NOT_KERNELS = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::_local_scalar_dense",
        "aten::detach",
        "aten::lift_fresh",
        "aten::_unsafe_view",
    }
)


def _kernel_counter() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class KernelCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Counts the ATen operations that would each launch a kernel (views and allocations do not)."""

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.kernels = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = func._schema.name
            if not (func.is_view or name.startswith("profiler::") or name in _NOT_KERNELS):
                self.kernels += 1
            return func(*args, **(kwargs or {}))

    return KernelCounter()


def _count(model_step: Any, batch: dict[str, Any]) -> tuple[float, float, int]:
    """(tensor FLOPs, bytes of the tensors saved for backward, kernels) of one training step."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * (FLOAT_BYTES if t.is_floating_point() else t.element_size())
        return t

    model_step(batch)  # once before: the optimizer's state exists from the first step on
    counter = _kernel_counter()
    with (
        FlopCounterMode(display=False) as flops,
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        counter,
    ):
        model_step(batch)
    return float(flops.get_total_flops()), float(saved[0]), int(counter.kernels)


def _per_sample(step: Any, make_batch: Any, batches: tuple[int, int] = (2, 4)) -> tuple[float, float, int]:
    """Per-sample FLOPs and saved bytes (the slope between two batch sizes: what is per step cancels)
    and the kernels of one step (the same at any batch)."""
    (f1, s1, k1), (f2, s2, _) = (_count(step, make_batch(b)) for b in batches)
    n = batches[1] - batches[0]
    return (f2 - f1) / n, (s2 - s1) / n, k1


def _meta_trainable(workload: str, size: str) -> Any:
    """The trainer's own Trainable (model, loss, optimizer), moved to the meta device: shapes without data."""
    import torch

    from gpuprobe.trainer.models import Trainable

    trainable = Trainable(workload, size, torch.device("cpu"))
    # swapped in place, so the optimizer's parameters are the moved ones
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        trainable.model.to(torch.device("meta"))
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    _multi_tensor(trainable.optimizer)
    return trainable


def _multi_tensor(optimizer: Any) -> None:
    """The optimizer as it runs on a GPU: multi-tensor (foreach) kernels, not one loop per parameter."""
    for group in optimizer.param_groups:
        group["foreach"] = True


def _meta_batch(trainable: Any, batch_size: int) -> dict[str, Any]:
    import torch

    batch = {k: v.to(torch.device("meta")) for k, v in trainable.make_batch(batch_size).items()}
    # an all-ones attention mask is no mask (transformers checks that with .item(), which a meta tensor
    # cannot answer): the same computation without it
    batch.pop("attention_mask", None)
    return dict(batch)


def _optimizer_name(optimizer: Any) -> str:
    return "adamw" if type(optimizer).__name__.lower().startswith("adam") else "sgd"


def compute_workload_cost(workload: str, size: str) -> dict[str, Any]:
    """One catalog workload's cost entry, from the real model and training step of gpuprobe.trainer.models."""
    trainable = _meta_trainable(workload, size)
    flops, saved, kernels = _per_sample(trainable.step, lambda b: _meta_batch(trainable, b))
    optimizer = _optimizer_name(trainable.optimizer)
    return {
        "description": WORKLOADS[workload].description,
        "flops_per_sample": flops,
        "activation_bytes_per_sample": 2.0 * saved,
        "param_bytes_per_step": float(trainable.params * PARAM_BYTES_PER_STEP[optimizer]),
        "kernels_per_step": kernels,
        "params": int(trainable.params),
        "optimizer": optimizer,
    }


def compute_calibration_cost(name: str) -> dict[str, Any]:
    """The published configurations, from the same model code."""
    import torch

    meta = torch.device("meta")
    if name == "resnet50-imagenet-224":
        entry = compute_workload_cost("resnet50", "full")  # torchvision's ResNet-50 v1.5 at 224x224
        entry["description"] = CALIBRATION_CONFIGS[name].description
        return entry
    if name == "bert-base-squad-384":
        from transformers import BertConfig, BertForQuestionAnswering

        seq_len = 384
        # the same BertConfig() as the bert-base workload's full model, with SQuAD's head and length
        model: Any = BertForQuestionAnswering(BertConfig())
        model.train()
        model.to(meta)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        _multi_tensor(optimizer)
        params = sum(p.numel() for p in model.parameters())

        def step(batch: dict[str, Any]) -> None:
            optimizer.zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            optimizer.step()

        def make_batch(b: int) -> dict[str, Any]:
            ids = torch.zeros((b, seq_len), dtype=torch.long, device=meta)
            positions = torch.zeros((b,), dtype=torch.long, device=meta)
            return {"input_ids": ids, "token_type_ids": ids, "start_positions": positions, "end_positions": positions}

        flops, saved, kernels = _per_sample(step, make_batch)
        return {
            "description": CALIBRATION_CONFIGS[name].description,
            "flops_per_sample": flops,
            "activation_bytes_per_sample": 2.0 * saved,
            "param_bytes_per_step": float(params * PARAM_BYTES_PER_STEP["adamw"]),
            "kernels_per_step": kernels,
            "params": int(params),
            "optimizer": "adamw",
        }
    raise KeyError(name)


def compute_costs(only: Sequence[str] | None = None) -> dict[str, Any]:
    """Everything workload_costs.json holds (``only``: just these keys, for tests)."""
    import torch
    import transformers

    workloads = {f"{w}/{s}": (w, s) for w, spec in WORKLOADS.items() if spec.needs_torch for s in SIZES}
    return {
        "comment": (
            "Per-sample training costs of the trainer's workloads, computed from the real models by "
            f"gpuprobe.trainer.costs; regenerate with `{REGENERATE_COMMAND}`. See docs/simulator.md."
        ),
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "workloads": {k: compute_workload_cost(*ws) for k, ws in workloads.items() if only is None or k in only},
        "calibration": {k: compute_calibration_cost(k) for k in CALIBRATION_CONFIGS if only is None or k in only},
    }


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        allow_abbrev=False, prog=REGENERATE_COMMAND, description=f"recompute {COSTS_PATH.name} from the real models"
    ).parse_args(argv)
    COSTS_PATH.write_text(json.dumps(compute_costs(), indent=2, sort_keys=False) + "\n")
    _cache.cache_clear()
    print(f"wrote {COSTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
