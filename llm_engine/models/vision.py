"""Vision transformers as Transformers defines them: CLIP-ViT and SigLIP.

Both cut the picture into patches with a convolution, add learned position embeddings and run
pre-norm encoder layers with full (non-causal) attention. CLIP adds a class token and a norm
before the encoder; SigLIP has neither and a bias on the patch convolution. Vision-language
models read the hidden states of one encoder layer (`feature_layer`), so only the layers up
to it are built and run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from transformers import PretrainedConfig

Activation = Callable[[torch.Tensor], torch.Tensor]

ACTIVATIONS: dict[str, Activation] = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def activation(name: str) -> Activation:
    if name not in ACTIVATIONS:
        raise ValueError(f"model: activation {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class VisionAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden // num_heads
        self.q_proj, self.k_proj = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.v_proj, self.out_proj = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        q, k, v = (proj(x).view(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(batch, tokens, hidden))
        return projected


class VisionMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, intermediate), nn.Linear(intermediate, hidden)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(self.act(self.fc1(x)))
        return out


class VisionEncoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)
        self.self_attn = VisionAttention(hidden, config.num_attention_heads)
        self.mlp = VisionMLP(hidden, config.intermediate_size, config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        out: torch.Tensor = x + self.mlp(self.layer_norm2(x))
        return out


class VisionEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig, class_token: bool) -> None:
        super().__init__()
        hidden, patch = config.hidden_size, config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, hidden, patch, stride=patch, bias=not class_token)
        num_positions = (config.image_size // patch) ** 2 + int(class_token)
        self.position_embedding = nn.Embedding(num_positions, hidden)
        self.class_embedding = nn.Parameter(torch.zeros(hidden)) if class_token else None

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        if self.class_embedding is not None:
            patches = torch.cat([self.class_embedding.expand(patches.shape[0], 1, -1), patches], dim=1)
        out: torch.Tensor = patches + self.position_embedding.weight[:patches.shape[1]]
        return out


def num_layers_needed(config: PretrainedConfig, feature_layer: int) -> int:
    """Encoder layers to run so that hidden state `feature_layer` (0 = embeddings) exists."""
    return feature_layer if feature_layer >= 0 else int(config.num_hidden_layers) + 1 + feature_layer


class VisionEncoder(nn.Module):
    """The first `depth` encoder layers (named `encoder.layers.N`, as in the checkpoints)."""

    def __init__(self, config: PretrainedConfig, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionEncoderLayer(config) for _ in range(depth))


class VisionTransformer(nn.Module):
    """CLIP (`class_token=True`) or SigLIP vision tower returning hidden state `feature_layer`
    (negative counts from the last, as in Transformers' `hidden_states`), with the final
    `post_layernorm` only when `final_norm` (Transformers' `last_hidden_state`)."""

    def __init__(self, config: PretrainedConfig, feature_layer: int, class_token: bool, final_norm: bool,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.patch_size, self.image_size = config.patch_size, config.image_size
        self.embeddings = VisionEmbeddings(config, class_token)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if class_token else None
        self.encoder = VisionEncoder(config, num_layers_needed(config, feature_layer))
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if final_norm else None
        self.to(dtype)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, H, W] -> hidden states [B, tokens, hidden] of the feature layer."""
        x: torch.Tensor = self.embeddings(pixels)
        if self.pre_layrnorm is not None:
            x = self.pre_layrnorm(x)
        for layer in self.encoder.layers:
            x = layer(x)
        return x if self.post_layernorm is None else self.post_layernorm(x)
