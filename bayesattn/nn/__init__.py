"""PyroModule layers, blocks and networks (see :mod:`bayesattn.nn.attention` first)."""

from .attention import BayesianMultiheadAttention
from .blocks import Decoder, DecoderLayer, Encoder, EncoderLayer
from .config import AttentionConfig
from .contract import NetworkContract, check_network
from .modes import attention_mode, collect_kl, current_mode
from .networks import (
    BayesianNetwork,
    CausalLM,
    GenerationResult,
    Seq2Seq,
    TransformerClassifier,
    VisionTransformer,
)
from .weights import bayesian_projections

__all__ = [
    "BayesianMultiheadAttention",
    "AttentionConfig",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "BayesianNetwork",
    "NetworkContract",
    "check_network",
    "TransformerClassifier",
    "VisionTransformer",
    "Seq2Seq",
    "CausalLM",
    "GenerationResult",
    "bayesian_projections",
    "attention_mode",
    "collect_kl",
    "current_mode",
]
