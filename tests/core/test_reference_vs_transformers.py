"""The float64 reference target against ``transformers`` on random Hugging Face-format folders.

``transformers`` computes RMSNorm, the rotary angles and (eager) softmax in float32 even for a
float64 model. Its model as shipped therefore agrees with the reference to float32 accuracy;
with those three pieces replaced by float64 twins it must agree to 1e-8.
"""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specdec.reference.model import load_target  # noqa: E402
from specdec.testing.batch import Batch  # noqa: E402
from specdec.testing.models import make_random_model  # noqa: E402

VOCAB = 64


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    small = dict(vocab_size=VOCAB, hidden_size=64, num_layers=2, seed=11)
    llama3 = make_random_model(root / "llama3", num_heads=4, num_kv_heads=2, **small)
    mistral = make_random_model(root / "mistral", num_heads=4, num_kv_heads=1, **small)
    return {
        "llama": make_random_model(root / "llama", num_heads=4, num_kv_heads=2, **small),
        "qwen2": make_random_model(
            root / "qwen2",
            num_heads=4,
            num_kv_heads=2,
            architecture="qwen2",
            tie_word_embeddings=False,
            **small,
        ),
        "llama3-rope": edit_config(
            llama3,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "mistral-window": edit_config(
            mistral, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=7
        ),
    }


def load_hf(folder, *, float64_islands: bool, inv_freq=None):
    """The folder in transformers, in float64; optionally with float64 norm, rotary and softmax."""
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(
            folder, attn_implementation="sdpa" if float64_islands else "eager"
        )
        .to(torch.float64)
        .eval()
    )
    if not float64_islands:
        return model

    def norm_forward(self, x):
        return self.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )

    def rotary_forward(self, x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            module.forward = types.MethodType(norm_forward, module)
        elif kind.endswith("RotaryEmbedding"):
            module.inv_freq = torch.from_numpy(inv_freq)
            module.forward = types.MethodType(rotary_forward, module)
    return model


def hf_logits(model, tokens) -> np.ndarray:
    """(n, V) logits of transformers at every position of one sequence."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double().numpy()


NAMES = ["llama", "qwen2", "llama3-rope", "mistral-window"]


@pytest.mark.parametrize("name", NAMES)
def test_inverse_frequencies_match_transformers(folders, name):
    target = load_target(folders[name])
    model = load_hf(folders[name], float64_islands=False)
    (rotary,) = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    np.testing.assert_allclose(
        target.inv_freq,
        rotary.inv_freq.double().numpy(),
        rtol=1e-6,
        err_msg=f"rotary_inverse_frequencies vs transformers (float32), {name}",
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("float64_islands, tolerance", [(True, 1e-8), (False, 1e-4)])
def test_logits_match_transformers(folders, name, float64_islands, tolerance):
    target = Batch(load_target(folders[name], slots=3))
    model = load_hf(folders[name], float64_islands=float64_islands, inv_freq=target.inv_freq)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, VOCAB, size=n).tolist() for n in (1, 9, 30)]
    out = target.prefill(prompts)
    for b, prompt in enumerate(prompts):
        np.testing.assert_allclose(
            out.logits[b, 0],
            hf_logits(model, prompt)[-1],
            rtol=0,
            atol=tolerance,
            err_msg=f"prefill last-position logits, {name}, prompt length {len(prompt)}, "
            f"float64_islands={float64_islands}",
        )
    # A chain tree after a prompt: node i sits at position len(prompt) + i.
    from specdec.types import DraftTree

    prompt, chain = prompts[2], rng.integers(0, VOCAB, size=6)
    target.prefill([prompt])
    n = chain.size
    tree = DraftTree(
        tokens=chain[None],
        parents=(np.arange(n) - 1)[None],
        depth=np.arange(n)[None],
        ancestor_mask=np.tril(np.ones((n, n), dtype=bool))[None],
        num_nodes=np.array([n]),
    )
    expected = hf_logits(model, prompt + chain.tolist())[len(prompt) :]
    np.testing.assert_allclose(
        target.forward_tree(tree).logits[0],
        expected,
        rtol=0,
        atol=tolerance,
        err_msg=f"forward_tree of a chain after a {len(prompt)}-token prompt, {name}, "
        f"float64_islands={float64_islands}",
    )
