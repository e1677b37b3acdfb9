r"""Whole Bayesian transformers: classifier, ViT, encoder–decoder, decoder-only LM.

Every network is a ``PyroModule`` with

* ``forward(...)``: deterministic logits (posterior-mean attention) unless a mode is set with
  :func:`~bayesattn.nn.modes.attention_mode`;
* ``model(x, y=None, num_data=None)``: the generative model, for ``pyro.infer.SVI`` and
  ``Predictive``: global weight sites (if any projections are Bayesian) outside the data plate,
  attention weights drawn from their priors and ``pyro.sample("obs", Categorical(logits), obs=y)``
  inside ``pyro.plate("data", num_data, subsample=arange(B))`` so the ELBO of a minibatch is scaled
  to a dataset of ``num_data`` examples;
* ``guide(x, y=None, num_data=None)``: the amortised attention posteriors (same layers, posterior
  mode) plus an autoguide for Bayesian projection weights;
* ``elbo_loss(x, y, num_data, beta, num_particles)``: the same ELBO in **one network pass**
  (analytic KLs collected from the layers; used by the hybrid trainer), estimated with
  ``num_particles`` Monte-Carlo particles (Pyro's word) that travel as the pass's sample dim ``S``.

What a network must implement (``forward_logits``, ``targets``) and what the trainers, ``predict``
and the diagnostics call is the network contract, :mod:`bayesattn.nn.contract`.

Shapes: tokens ``(B, T)`` int64 (``pad_id`` = padding) or vectors ``(B, T, D)``; logits
``(*S, B, C)`` for classifiers, ``(*S, B, T, V)`` for sequence models.
"""

from .base import BayesianNetwork, Embedding, TrunkMixture
from .causal_lm import CausalLM
from .classifier import TransformerClassifier
from .foreign import ModuleClassifier
from .generative import GenerationResult
from .seq2seq import Seq2Seq
from .vit import VisionTransformer

__all__ = [
    "BayesianNetwork",
    "TransformerClassifier",
    "VisionTransformer",
    "Seq2Seq",
    "CausalLM",
    "ModuleClassifier",
    "GenerationResult",
    "TrunkMixture",
]

#: whole-network pickles (``torch.save(net)``) written before the split into modules name the
#: embedding class ``bayesattn.nn.networks._Embedding``
_Embedding = Embedding
