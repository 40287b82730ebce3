"""Published Transformer-XL files: Hugging Face's TransfoXL folders (`hf.py`), the authors' TensorFlow checkpoints
(`tf_checkpoint.py`), and the published models' vocabularies, test texts and paper settings (`published.py`)."""
