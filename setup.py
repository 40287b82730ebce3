"""Packaging for labml_txl: Transformer-XL and Transformer configurations on labml."""
from pathlib import Path

import setuptools

README = Path(__file__).parent / 'README.md'

setuptools.setup(
    name='labml_txl',
    version='0.1.0',
    description='Transformer-XL and Transformer configurations in the style of labml',
    long_description=README.read_text(encoding='utf-8') if README.exists() else '',
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['labml_txl', 'labml_txl.*']),
    # The C++ kernels are compiled on first use (`labml_txl/fast/native/build.py`), so they ship as sources
    package_data={'labml_txl': ['data/*.gz', 'fast/native/*.cpp']},
    python_requires='>=3.9',
    # torch 2.13.0 satisfies this range, so a machine that has it installs no other build. ninja builds the C++
    # kernels (with the machine's C++ compiler); without either, PyTorch's paths run instead.
    install_requires=['torch>=2.4', 'labml>=0.5.3', 'labml-helpers>=0.4.89', 'ninja', 'safetensors>=0.4'],
    extras_require={
        # labml-nn declares torchvision, torchtext and fairscale, which pull a multi-GB CUDA torch;
        # its transformer modules need only torch and labml, so `make test` installs it with --no-deps
        # (requirements/no-deps.lock). `make test` pins every package at the version of requirements/test.lock.
        'test': ['pytest>=7'],
        # The page's d3, Bootstrap and Font Awesome come from npm (package.json), or from their CDNs without it
        'dashboard': ['labml-app>=0.5.14'],
        # The plots of the experiments (`experiments/position_schemes.py`)
        'experiments': ['matplotlib>=3.5'],
        # The independent implementations the tests and the benchmark compare against: Hugging Face's TransfoXL
        # (4.44.2 is the last release that ships it, deprecated; its tokenizer needs sacremoses) and x-transformers
        'peers': ['transformers==4.44.2', 'sacremoses>=0.1', 'x-transformers>=2.0'],
        # Reading the authors' TensorFlow checkpoints (`labml_txl/xl/formats/tf_checkpoint.py`); 2.18 is the first
        # TensorFlow for numpy 2. `make test` installs the versions of requirements/tf.lock
        'tf': ['tensorflow-cpu>=2.18; platform_system == "Linux"', 'tensorflow>=2.18; platform_system != "Linux"'],
        # The kNN memory's faiss index (`knn_index='faiss'`, `labml_txl/memories/retrieval.py`). `make test-faiss`
        # installs the version of requirements/faiss.lock
        'faiss': ['faiss-cpu>=1.8'],
    },
)
