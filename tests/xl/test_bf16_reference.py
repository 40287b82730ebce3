r"""
`MemTransformerLM` in float32 under `torch.autocast('cpu', dtype=torch.bfloat16)` against the original's float64
vectors (`tests/reference/xl/*.pt`, run as `test_reference.py` runs them, without gradients), every file.

What is asked, and why:

* the mean loss of every segment within 1e-2 of the reference's (issue 17's figure): measured at most 0.006;
* every position's loss within one bf16 unit in the last place of the reference's ($2^{-7} |\ell|$), not 1e-2.
  Under autocast the per-position losses come out in bf16, whose spacing between 4 and 8 (where these losses lie)
  is $2^{-5} = 0.031$: rounding the reference's own losses to bf16 moves them by up to 0.0155, so no bf16
  computation can put every position within 1e-2. Measured: at most $0.0061 |\ell|$ (0.041 absolute);
* the autocast is real: the losses are bf16, and the float32-only paths (our kernels, oneDNN's prepacked products)
  are refused for it.
"""
import pytest
import torch

from labml_txl import dispatch
from labml_txl.xl import MemTransformerLM

from .helpers import REFERENCE_DIR, reference_files

FILES = [f for f in reference_files() if f is not None] + [REFERENCE_DIR / 'original_numerics' / 'absolute_prelnorm.pt']
# One bf16 unit in the last place, relative: bf16 keeps 8 significant bits
BF16_ULP = 2.0 ** -7


@pytest.mark.parametrize('path', FILES, ids=lambda p: p.stem)
def test_bf16_autocast_losses_match_the_reference(path):
    assert path.is_file(), f'reference vectors missing: {path}'
    ref = torch.load(path, weights_only=True)
    model = MemTransformerLM(**ref['config']['model'], original_numerics=path.parent.name == 'original_numerics')
    model.load_state_dict(ref['state_dict'], strict=True)
    model = model.float().eval()
    data, mems = ref['data'], []
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16), dispatch.recording() as choices:
        for i, ((tgt_len, mem_len, ext_len), seg) in enumerate(zip(ref['config']['segments'], ref['segments'])):
            model.reset_length(tgt_len, ext_len, mem_len)
            start = seg['start']
            loss, *mems = model(data[max(0, start - ext_len): start + tgt_len],
                                data[start + 1: start + 1 + tgt_len], *mems)
            assert loss.dtype == torch.bfloat16
            expected = seg['loss']
            assert abs(loss.double().mean().item() - expected.mean().item()) < 1e-2, f'segment {i}: mean loss'
            torch.testing.assert_close(loss.double(), expected, atol=0, rtol=BF16_ULP,
                                       msg=lambda m: f'segment {i}: {m}')
    chosen = {(c.operation, c.chosen) for c in choices}
    assert ('attention', 'kernel') not in chosen and ('linear', 'prepacked') not in chosen
    assert ('linear', 'F.linear') in chosen
