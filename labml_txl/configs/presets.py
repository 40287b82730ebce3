r"""
# The presets of the original run scripts, in one table

Each row is one script of the original code (`run_enwik8_base.sh`, ..., `tests/reference/xl/presets.md`): the model
and evaluation columns (`TransformerXLConfigs`) and the training columns (`TrainXLConfigs`). `preset=NAME` sets all
of them; any item can still be overridden after it. All use `attn_type` 0, tied weights and `d_embed = d_model`;
optimizer Adam, lr 0.00025, the cosine schedule and clip 0.25 are the training configs' defaults already.
"""
from typing import Dict

_CHARACTER_BASE = dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, dropout=0.1, dropatt=0.0,
                       tgt_len=512, mem_len=512, eval_tgt_len=128, test_tgt_len=80, test_mem_len=2100,
                       test_clamp_len=820, cutoffs=[], div_val=1, tie_projs='none')
_CHARACTER_LARGE = dict(n_layer=24, d_model=1024, n_head=8, d_head=128, d_inner=3072, dropout=0.15, dropatt=0.15,
                        tgt_len=768, mem_len=768, eval_tgt_len=128, test_tgt_len=128, test_mem_len=3800,
                        test_clamp_len=1000, cutoffs=[], div_val=1, tie_projs='none')

# Model and evaluation columns, then the training columns
PRESETS: Dict[str, dict] = {
    'enwik8_base': dict(**_CHARACTER_BASE, warmup_step=0, max_step=400000, batch_size=22),
    'enwik8_large': dict(**_CHARACTER_LARGE, warmup_step=4000, max_step=400000, batch_size=64),
    'text8_base': dict(**_CHARACTER_BASE, warmup_step=0, max_step=400000, batch_size=22),
    'text8_large': dict(**_CHARACTER_LARGE, warmup_step=0, max_step=400000, batch_size=64),
    'wt103_base': dict(n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100, dropout=0.1, dropatt=0.0,
                       tgt_len=150, mem_len=150, eval_tgt_len=150, test_tgt_len=64, test_mem_len=640,
                       test_clamp_len=400, cutoffs=[20000, 40000, 200000], div_val=1, tie_projs='all_but_first',
                       warmup_step=0, max_step=200000, batch_size=60),
    'wt103_large': dict(n_layer=18, d_model=1024, n_head=16, d_head=64, d_inner=4096, dropout=0.2, dropatt=0.2,
                        tgt_len=384, mem_len=384, eval_tgt_len=128, test_tgt_len=128, test_mem_len=1600,
                        test_clamp_len=1000, cutoffs=[20000, 40000, 200000], div_val=4, tie_projs='all_but_first',
                        warmup_step=16000, max_step=4000000, batch_size=128),
    'lm1b_base': dict(n_layer=18, d_model=1024, n_head=8, d_head=128, d_inner=4096, dropout=0.0, dropatt=0.0,
                      tgt_len=32, mem_len=32, eval_tgt_len=32, test_tgt_len=32, test_mem_len=128, test_clamp_len=-1,
                      cutoffs=[60000, 100000, 640000], div_val=4, tie_projs='none',
                      warmup_step=20000, max_step=500000, batch_size=224),
    'lm1b_large': dict(n_layer=24, d_model=1280, n_head=16, d_head=80, d_inner=8192, dropout=0.05, dropatt=0.05,
                       tgt_len=32, mem_len=32, eval_tgt_len=32, test_tgt_len=32, test_mem_len=128, test_clamp_len=-1,
                       cutoffs=[60000, 100000, 640000], div_val=4, tie_projs='none',
                       warmup_step=30000, max_step=1200000, batch_size=512),
}

# The columns `TrainXLConfigs` sets; every other column is an item of `TransformerXLConfigs`
TRAINING_COLUMNS = ('warmup_step', 'max_step', 'batch_size')
