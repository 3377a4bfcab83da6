"""Part: trainer. The workloads' models, synthetic data and training steps (imports torch; see ``catalog`` for the
list).

Every model is built from its configuration with random weights; nothing is downloaded. ``full``
is the standard model (ResNet-50 v1.5: 25.6 M parameters, BERT-base: 110 M, GPT-2 small: 124 M);
``tiny`` is a small configuration of the same architecture that trains in milliseconds per step on a
CPU. Data is synthetic, generated once per batch size on the device and reused every step, so no
input pipeline is measured and the loss falls as the model fits that batch. On CUDA the steps run
under bf16 autocast, and the CNN in channels-last memory format.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class ModelPreset:
    """Shape parameters of one workload at one size."""

    image_size: int = 224
    num_classes: int = 1000
    seq_len: int = 128
    width: int = 8192
    layers: int = 4


PRESETS: dict[tuple[str, str], ModelPreset] = {
    ("resnet50", "full"): ModelPreset(image_size=224, num_classes=1000),
    ("resnet50", "tiny"): ModelPreset(image_size=32, num_classes=10),
    ("bert-base", "full"): ModelPreset(seq_len=128),
    ("bert-base", "tiny"): ModelPreset(seq_len=32),
    ("gpt", "full"): ModelPreset(seq_len=1024),
    ("gpt", "tiny"): ModelPreset(seq_len=64),
    ("matmul-burn", "full"): ModelPreset(width=8192, layers=4),
    ("matmul-burn", "tiny"): ModelPreset(width=128, layers=2),
}


class MatmulBurn(nn.Module):
    """Square linear layers with ReLU between them: nearly all the time goes into GEMMs."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


def build_model(workload: str, size: str) -> nn.Module:
    """The model on torch's current default device (use ``with torch.device("meta")`` to count cheaply)."""
    preset = PRESETS[(workload, size)]
    if workload == "resnet50":
        from torchvision.models import resnet

        cnn: nn.Module
        if size == "full":
            cnn = resnet.resnet50(weights=None, num_classes=preset.num_classes)
        else:
            # the same bottleneck architecture (v1.5: stride in the 3x3 conv) with one block per stage
            cnn = resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=preset.num_classes, width_per_group=16)
        return cnn
    if workload == "bert-base":
        from transformers import BertConfig, BertForPreTraining

        if size == "full":
            return BertForPreTraining(BertConfig())
        return BertForPreTraining(
            BertConfig(
                vocab_size=1024,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=256,
                max_position_embeddings=preset.seq_len,
            )
        )
    if workload == "gpt":
        from transformers import GPT2Config, GPT2LMHeadModel

        if size == "full":
            gpt = GPT2LMHeadModel(GPT2Config())
        else:
            config = GPT2Config(
                vocab_size=1024,
                n_positions=preset.seq_len,
                n_embd=64,
                n_layer=2,
                n_head=2,
                bos_token_id=0,
                eos_token_id=0,
            )
            gpt = GPT2LMHeadModel(config)
        gpt.loss_type = "ForCausalLM"  # what it defaults to anyway, without a warning
        return gpt
    if workload == "matmul-burn":
        return MatmulBurn(preset.width, preset.layers)
    raise ValueError(f"workload {workload!r} has no model")


def parameter_count(workload: str, size: str) -> int:
    """Parameters of the model, counted on the ``meta`` device (no memory, no compute)."""
    with torch.device("meta"):
        model = build_model(workload, size)
    return count_parameters(model)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights, such as GPT-2's embedding and LM head, count once)."""
    return sum(p.numel() for p in model.parameters())


Batch = dict[str, torch.Tensor]


class Trainable:
    """One model with its optimizer and a way to make a synthetic batch and run one training step."""

    def __init__(self, workload: str, size: str, device: torch.device, seed: int = 0) -> None:
        self.workload = workload
        self.size = size
        self.device = device
        self.preset = PRESETS[(workload, size)]
        self.cuda = device.type == "cuda"
        torch.manual_seed(seed)
        self._generator = torch.Generator(device=device).manual_seed(seed)
        with torch.device(device):
            model = build_model(workload, size)
        if self.cuda and workload == "resnet50":
            model = model.to(memory_format=torch.channels_last)
        model.train()
        self.model = model
        config: Any = getattr(model, "config", None)
        self.vocab_size = int(config.vocab_size) if config is not None else 0
        self.params = count_parameters(model)
        self.optimizer: torch.optim.Optimizer
        if workload == "resnet50":
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
            self.optimizer_states = 1
        elif workload == "matmul-burn":
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            self.optimizer_states = 1
        else:
            lr = 1e-4 if size == "full" else 1e-3
            self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
            self.optimizer_states = 2
        self._loss_fn: Callable[[Batch], torch.Tensor] = {
            "resnet50": self._resnet_loss,
            "bert-base": self._bert_loss,
            "gpt": self._gpt_loss,
            "matmul-burn": self._matmul_loss,
        }[workload]

    # --- synthetic data, made on the device ----------------------------------------------------------

    def _randint(self, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(0, high, shape, device=self.device, generator=self._generator)

    def _randn(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, device=self.device, generator=self._generator)

    def make_batch(self, batch_size: int) -> Batch:
        p = self.preset
        if self.workload == "resnet50":
            images = self._randn((batch_size, 3, p.image_size, p.image_size))
            if self.cuda:
                images = images.contiguous(memory_format=torch.channels_last)
            return {"images": images, "labels": self._randint(p.num_classes, (batch_size,))}
        if self.workload == "bert-base":
            vocab = self.vocab_size
            ids = self._randint(vocab, (batch_size, p.seq_len))
            token_types = torch.zeros_like(ids)
            token_types[:, p.seq_len // 2 :] = 1
            masked = torch.rand((batch_size, p.seq_len), device=self.device, generator=self._generator) < 0.15
            labels = torch.where(masked, ids, torch.full_like(ids, -100))
            return {
                "input_ids": ids,
                "token_type_ids": token_types,
                "attention_mask": torch.ones_like(ids),
                "labels": labels,
                "next_sentence_label": self._randint(2, (batch_size,)),
            }
        if self.workload == "gpt":
            ids = self._randint(self.vocab_size, (batch_size, p.seq_len))
            return {"input_ids": ids, "labels": ids}
        return {"x": self._randn((batch_size, p.width)), "target": self._randn((batch_size, p.width))}

    # --- losses --------------------------------------------------------------------------------------

    def _resnet_loss(self, batch: Batch) -> torch.Tensor:
        logits = self.model(batch["images"])
        return nn.functional.cross_entropy(logits, batch["labels"])

    def _bert_loss(self, batch: Batch) -> torch.Tensor:
        out: Any = self.model(**batch)
        loss: torch.Tensor = out.loss
        return loss

    def _gpt_loss(self, batch: Batch) -> torch.Tensor:
        out: Any = self.model(**batch)
        loss: torch.Tensor = out.loss
        return loss

    def _matmul_loss(self, batch: Batch) -> torch.Tensor:
        out = self.model(batch["x"])
        return nn.functional.mse_loss(out.float(), batch["target"])

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        if self.cuda:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                yield
        else:
            yield

    def step(self, batch: Batch) -> torch.Tensor:
        """One optimizer step; returns the loss (detached, still on the device: no synchronization)."""
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self._loss_fn(batch)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return loss.detach()

    def synchronize(self) -> None:
        """Wait for the device to finish what was queued (CUDA runs asynchronously)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()
