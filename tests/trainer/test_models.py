"""The workloads' models: the full sizes are the standard models, the tiny ones the same architectures."""

from __future__ import annotations

import pytest
import torch

from gpuprobe import workloads
from gpuprobe.trainer.models import build_model, parameter_count

# The standard models' parameter counts (random-weight builds from their default configurations).
FULL_PARAMETERS = {
    "resnet50": 25_557_032,  # torchvision ResNet-50 v1.5: "25.6 M"
    "bert-base": 110_106_428,  # BertForPreTraining(BertConfig()): BERT-base "110 M" plus its pre-training heads
    "gpt": 124_439_808,  # GPT2LMHeadModel(GPT2Config()): GPT-2 small "124 M" (LM head tied to the embedding)
    "matmul-burn": 4 * 8192 * 8192,
}


@pytest.mark.parametrize("workload", sorted(FULL_PARAMETERS))
def test_full_size_is_the_standard_model(workload: str) -> None:
    assert parameter_count(workload, "full") == FULL_PARAMETERS[workload]


def test_full_resnet50_is_v1_5_with_the_stride_in_the_3x3_convolution() -> None:
    with torch.device("meta"):
        model = build_model("resnet50", "full")
    first_block = model.layer2[0]  # type: ignore[index]
    assert first_block.conv1.stride == (1, 1)
    assert first_block.conv2.stride == (2, 2)


@pytest.mark.parametrize("workload", ["resnet50", "bert-base", "gpt", "matmul-burn"])
def test_tiny_is_a_small_model_of_the_same_architecture(workload: str) -> None:
    with torch.device("meta"):
        full, tiny = build_model(workload, "full"), build_model(workload, "tiny")
    assert type(tiny) is type(full)
    assert parameter_count(workload, "tiny") < parameter_count(workload, "full") / 5


def test_the_catalog_lists_exactly_the_built_in_workloads() -> None:
    assert workloads.WORKLOAD_NAMES == ("resnet50", "bert-base", "gpt", "matmul-burn", "idle")
    assert workloads.runnable_workloads() == list(workloads.WORKLOAD_NAMES)  # torch is installed here
    assert not workloads.WORKLOADS["idle"].needs_torch
