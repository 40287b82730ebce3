"""
`experiments/benchmark.py` and its peers (`experiments/benchmark_peers.py`) on tiny sizes: every row is measured and
printed, Hugging Face's TransfoXL with our weights computes our numbers (and the check before timing catches a model
that does not), the peers generate with memories as ours does, the targets are judged from the ratios, and
`--device cuda` without CUDA is refused. No test looks at wall-clock time: only that each figure was measured.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import benchmark as bench  # noqa: E402
from benchmark_peers import HuggingFaceXL, XTransformersXL, check_same_outputs, hf_on_current_torch  # noqa: E402
from tolerance import SAME_FUNCTION, assert_close_rounding, xl_config, xl_depths  # noqa: E402

TINY = bench.BenchConfig(n_token=16, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=4, mem_len=4,
                         batch=2, repeats=1, matmul_n=32, gen_context=6, gen_tokens=5, gen_repeats=1)


def test_benchmark_measures_every_row_on_tiny_sizes():
    notes = []
    speed = bench.measure_speed(TINY, compile_model=False, notes=notes)
    assert set(speed) == {'fast', 'plain', 'labml_nn', 'bf16 autocast', bench.HF, bench.XT, 'matmul', 'linear',
                          'products alone', 'fast without our kernels'}
    assert set(speed['matmul']) == {'torch.mm', 'oneDNN'} and set(speed['linear']) == {'float32', 'bfloat16'}
    generation = bench.measure_generation(TINY, notes=notes)
    assert set(generation) == {'fast', bench.HF, bench.XT}
    for name, row in generation.items():
        speed[name].update(row)
    assert all(v > 0 for row in speed.values() for v in row.values())
    assert all(set(speed[name]) == {'train', 'eval', 'generate'} for name in ('fast', bench.HF, bench.XT))
    assert any(note.startswith(f'{bench.HF}: our weights') for note in notes)
    assert any(note.startswith(f'{bench.XT}:') and 'not the same attention' in note for note in notes)
    # Hugging Face's TransfoXL holds our weights: its greedy tokens are ours
    assert any(note.startswith(f"generation: {bench.HF}'s `generate` starts from zero memories, ours from none; its "
                               f"greedy tokens equal ours in ") and note.endswith(' of 5') for note in notes), notes
    table9 = bench.measure_table9(TINY, [4, 8], repeats=1)
    assert [r['length'] for r in table9] == [4, 8]
    assert all(r[k] > 0 for r in table9 for k in ('xl_segment', 'xl_token', 'vanilla'))
    few_rows = bench.measure_few_rows(TINY, repeats=1)
    assert list(few_rows) == list(bench.FEW_ROWS)
    assert all(set(seconds) == {'few rows', 'oneDNN', 'F.linear'} and min(seconds.values()) > 0
               for seconds in few_rows.values())
    memory = bench.measure_memory(TINY, [8])
    assert all(memory[0][path][k] > 0 for path in ('fast', 'plain') for k in ('model_mib', 'mems_mib'))
    assert all(memory[0][path]['eval_peak_mib'] >= 0 for path in ('fast', 'plain'))
    mechanisms = bench.measure_mechanisms(TINY)
    assert len(mechanisms) == 5 and any(name.startswith('kNN memory') for name in mechanisms)
    assert all(set(row) == {'train', 'eval'} and min(row.values()) > 0 for row in mechanisms.values())
    table = bench.format_table(bench.speed_rows(speed, TINY) + bench.table9_rows(table9)
                               + bench.few_rows_rows(few_rows) + bench.memory_rows(memory)
                               + bench.mechanism_rows(mechanisms))
    lines = table.splitlines()
    assert lines[0] == '| measurement | value | ratio |'
    assert set(speed['fast without our kernels']) == {'train', 'eval'}
    for needle in ('train: fast vs plain', 'train: fast vs labml_nn', 'eval: fast vs plain', 'eval: fast vs labml_nn',
                   'train: fast vs HF TransfoXL', 'eval: fast vs HF TransfoXL', 'generate: fast vs HF TransfoXL',
                   'train: fast vs x-transformers', 'eval: fast vs x-transformers', 'generate: fast vs x-transformers',
                   'generate: fast tokens/s (batch 1, context 6, 5 greedy tokens)',
                   "eval: the fast path's products alone", 'train: fast vs fast without our kernels',
                   'eval: fast vs fast without our kernels', 'bf16 autocast', "bf16 product vs float32",
                   "train step matmul FLOP/s (fast), of the float32 peak: oneDNN's prepacked GEMM",
                   'train step matmul FLOP/s (fast), of torch.mm', 'Table 9, L=4', 'Table 9, L=8',
                   "a step's products, rows=1: few-rows kernel vs oneDNN", "a step's products, rows=32",
                   'eval peak memory above the model, mem_len=8', "train tok/s, Transformer-XL's memory (4)",
                   'train tok/s, compressed memory (2 + 2, conv, rate 2)',
                   'eval tok/s, memory tokens (16, no XL memory)',
                   'eval tok/s, memory tokens (16) + XL memory (4)'):
        assert any(needle in line for line in lines), needle
    assert all('not the same attention' in line for line in lines if 'vs x-transformers' in line)
    targets = bench.target_rows(speed, TINY)
    assert len(targets) == len(bench.TARGETS) + 1
    assert all(met in ('yes', 'no') for _, _, met in targets)
    assert bench.train_step_flops(TINY) == 3 * bench.forward_flops(TINY) > 0


def test_targets_are_judged_from_the_ratios_of_this_run():
    # The fast path at 100 tokens/s in every mode; each peer set to land just above or below its target
    speed = {'fast': {'train': 100.0, 'eval': 100.0, 'generate': 100.0},
             bench.HF: {'train': 100 / 2.31, 'eval': 100 / 3.99, 'generate': 100 / 5.0},
             bench.XT: {'train': 100 / 1.69, 'eval': 100 / 3.51, 'generate': 100 / 2.9},
             # 100 tokens/s of a step of `train_step_flops` FLOPs over `tokens()` tokens, against a peak 2.5x that
             'matmul': {'torch.mm': 1.0, 'oneDNN': bench.train_step_flops(TINY) * 100 / TINY.tokens() * 2.5}}
    met = {row[0]: row[2] for row in bench.target_rows(speed, TINY)}
    assert met == {f'train: fast >= 2.3x {bench.HF}': 'yes', f'train: fast >= 1.7x {bench.XT}': 'no',
                   f'eval: fast >= 4.0x {bench.HF}': 'no', f'eval: fast >= 3.5x {bench.XT}': 'yes',
                   f'generate: fast >= 5.0x {bench.HF}': 'yes', f'generate: fast >= 3.0x {bench.XT}': 'no',
                   "train step: about 40% of the float32 peak (oneDNN; the issue's gloss of the training targets)": 'yes'}
    # Without oneDNN the peak is torch.mm's
    del speed['matmul']['oneDNN']
    assert bench.peak_gemm(speed) == ('torch.mm', 1.0)



def test_hugging_face_peer_computes_our_log_probabilities_and_the_check_catches_a_model_that_does_not(hf_in_float64):
    # In float64, the same function (tolerance.py's rule 1); `original_numerics`: Hugging Face's attention rounds its
    # scores to float32 (`attn_score.float()`, as the original does), which changes nothing in float32
    ours = bench.make_xl(TINY, original_numerics=True)
    hf = HuggingFaceXL(ours).double()
    ours.double()
    # (log-probabilities over 16 tokens, of size ~3: SAME_FUNCTION unscaled is within the rule's tolerance)
    assert check_same_outputs(ours, hf, TINY.n_token, TINY.tgt_len, TINY.batch, atol=SAME_FUNCTION) <= SAME_FUNCTION
    with torch.no_grad():
        ours.layers[0].pos_ff.CoreNet[0].weight.add_(0.1)
    with pytest.raises(AssertionError, match="Hugging Face's TransfoXL with our weights differs"):
        check_same_outputs(ours, hf, TINY.n_token, TINY.tgt_len, TINY.batch)


def test_peers_keep_memories_of_their_length_and_generate_through_their_own_calls():
    ours = bench.make_xl(TINY, mem_len=TINY.gen_context).eval()
    prompt = torch.randint(TINY.n_token, (9, 1), generator=torch.Generator().manual_seed(1))
    hf = HuggingFaceXL(ours).eval()
    # Hugging Face's own `generate`, with its memories, starts them as `mem_len` zero vectors (its `init_mems`), where
    # ours start empty: its greedy tokens and the log-probabilities it chose them by are ours from the same zero
    # memories, one token at a time
    with torch.no_grad():
        log_probs, mems = ours.log_probs(prompt, [torch.zeros(TINY.gen_context, 1, TINY.d_model)] * (TINY.n_layer + 1))
        from_zeros, zeros_log_probs = [], []
        for _ in range(7):
            zeros_log_probs.append(log_probs[-1])
            from_zeros.append(log_probs[-1].argmax(-1))
            log_probs, mems = ours.log_probs(from_zeros[-1][None], mems)
        with hf_on_current_torch():
            scores = torch.stack(hf.hf.generate(prompt.t(), max_new_tokens=7, do_sample=False, eos_token_id=None,
                                                pad_token_id=0, output_scores=True,
                                                return_dict_in_generate=True).scores)
    assert torch.equal(hf.generate(prompt, 7), torch.stack(from_zeros))
    # Rule 2 (float32 both): the log-probabilities over a memory of gen_context and the segment
    depth = xl_depths(xl_config(ours), TINY.gen_context + 9)[1]
    magnitude = torch.stack(zeros_log_probs).abs().max().item()
    assert_close_rounding(scores, torch.stack(zeros_log_probs), depth=depth, magnitude=magnitude)
    peer = XTransformersXL(bench.replace(TINY, mem_len=TINY.gen_context)).eval()
    with torch.no_grad():
        log_probs, mems = peer.step_log_probs(prompt, None)
        assert log_probs.shape == (9, 1, TINY.n_token)
        # Log-probabilities: each row sums to one, to float32's rounding (tolerance.py's rule 2): the log-softmax's sum
        # and this one over the vocabulary, and four single roundings (the shift by the maximum, exp, log, the
        # subtraction), of the size of the log-probabilities (an error in log p is a relative one in p)
        assert_close_rounding(log_probs.exp().sum(-1), torch.ones(9, 1), depth=2 * TINY.n_token + 4,
                              magnitude=max(1.0, log_probs.abs().max().item()))
        _, mems = peer.step_log_probs(prompt[:1], mems)
    assert all(m.shape[-2] == TINY.gen_context for m in mems)
    # x-transformers' own `generate` with kept keys and values (`cache_kv=True`): the tokens of its forward's argmax,
    # one at a time over the whole sequence (a window, `max_seq_len`, as long as prompt and tokens)
    generator = XTransformersXL(bench.replace(TINY, mem_len=TINY.gen_context, tgt_len=16)).eval()
    tokens = generator.generate(prompt, 7)
    assert tokens.shape == (7, 1)
    with torch.no_grad():
        sequence = prompt
        for _ in range(7):
            logits = generator.model(sequence.t())
            sequence = torch.cat([sequence, logits[:, -1].argmax(-1)[None]])
    assert torch.equal(tokens, sequence[9:])
    assert not generator.model.training, 'generate leaves the peer in evaluation mode'


def test_hugging_face_peer_trains_on_its_own_loss_with_labels():
    """The peer's training and evaluation call is Hugging Face's forward with `labels`: its losses are ours for the
    targets it scores (all of a segment's but the first: it shifts the labels inside), segment after segment."""
    ours = bench.make_xl(TINY).eval()
    hf = HuggingFaceXL(ours).eval()
    data = torch.randint(TINY.n_token, (3 * TINY.tgt_len + 1, TINY.batch), generator=torch.Generator().manual_seed(2))
    ours_mems, hf_mems = [], []
    with torch.no_grad():
        for start in range(0, 3 * TINY.tgt_len, TINY.tgt_len):
            segment, target = data[start:start + TINY.tgt_len], data[start + 1:start + TINY.tgt_len + 1]
            loss, *ours_mems = ours(segment, target, *ours_mems)
            hf_loss, *hf_mems = hf(segment, target, *hf_mems)
            assert hf_loss.shape == (TINY.tgt_len - 1, TINY.batch)
            # Rule 2 (float32 both): the depth of the log-probabilities over a memory of mem_len
            depth = xl_depths(xl_config(ours), TINY.mem_len + TINY.tgt_len)[1]
            assert_close_rounding(hf_loss, loss[:-1], depth=depth, magnitude=loss.abs().max().item())


def test_cuda_is_refused_clearly_where_it_is_not_available(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(sys, 'argv', ['benchmark.py', '--quick', '--device', 'cuda'])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert 'torch.cuda.is_available() is False' in captured.err and 'nothing was measured' in captured.err
    assert captured.out == ''
