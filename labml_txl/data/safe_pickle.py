"""
# A pickle reader that runs no code

A pickle is a program: its `GLOBAL` / `STACK_GLOBAL` / `INST` opcodes name any importable `module.name`, and
`REDUCE` / `NEWOBJ` / `BUILD` call it. `pickle.load` imports that module and calls what the file says, so loading an
untrusted pickle runs its code (this is why Hugging Face deprecated TransfoXL, whose tokenizer unpickles
`vocab.pkl`). Every path to a callable goes through `Unpickler.find_class` (also the `EXT*` opcodes), so this reader
overrides it: it never imports the module a pickle names. It answers from a fixed table instead:

* data constructors that run no user code: `collections.Counter`, `collections.OrderedDict`, `set` and `frozenset`
  (`builtins.` or Python 2's `__builtin__.`), and protocol 2's two forms of bytes, `_codecs.encode(<str>, 'latin1')`
  and `bytes()` (mapped to functions that accept nothing else);
* the classes the published Transformer-XL files hold, each mapped to an inert `PickledObject` that keeps the
  attributes and creation arguments the file gives it: the original's `data_utils.Corpus`, `utils.vocabulary.Vocab`
  (PyTorch code) and `vocabulary.Vocab` (TensorFlow code), and the objects `TransfoXLTokenizer.save_vocabulary` of
  transformers 4.44 pickles beside the vocabulary (`re._compile`, sacremoses' Moses classes,
  `transformers.tokenization_utils.Trie`, `tokenizers.AddedToken`): none is imported or run;
* numpy arrays (`numpy.core.multiarray._reconstruct`, also numpy 2's `numpy._core`, `numpy.ndarray`,
  `numpy.dtype`), rebuilt as torch tensors from their raw bytes without numpy: the authors' TensorFlow `cache.pkl`
  holds its encoded splits so;
* `torch._utils._rebuild_tensor_v2`, which makes a tensor of a storage that `torch.load` reads itself.

Anything else raises `ForbiddenGlobalError`, naming the module and name asked for and listing what is accepted.

`torch.save` files (`.pt`, the original's `cache.pt`, the Hugging Face hub's `vocab.pkl`) are pickles too, whose
tensors arrive by persistent ids. `load_file` reads them with `torch.load(..., pickle_module=<this module>,
weights_only=False)`: torch then unpickles with a subclass of this module's `Unpickler` and only adds what it needs
for storages (the storage type names, which it maps to dtypes itself, and the persistent ids). `weights_only=True`
would also refuse code, but it reads only `torch.save` files (not the plain pickles of `save_vocabulary` and of the
authors' TensorFlow `cache.pkl`), allows its own wider list of torch names, and takes extra classes only through a
process-wide allow-list (`torch.serialization.add_safe_globals`); one table here covers every format. A TorchScript
archive, which `torch.load` would hand to `torch.jit.load`, is refused before torch sees it.

```python
from .safe_pickle import load_file
state = load_file('vocab.pkl')      # dict, list, Counter, PickledObject, tensors: data only
```
"""
import io
import pickle
import sys
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch

from .files import DataFileFormatError, require_file


class ForbiddenGlobalError(pickle.UnpicklingError, ValueError):
    """A pickle asked for a global (a class or function) that is not in `ACCEPTED_GLOBALS`. It is a `ValueError` too:
    the file is the user's, and the scripts print such errors as one `error:` line (`cli.run_script`).

    Attributes:
        module: the module the pickle names
        name: the name in that module
        source: the file, when known
    """

    def __init__(self, module: str, name: str, source: Optional[Union[str, Path]] = None):
        self.module, self.name, self.source = module, name, source
        where = f"the pickle {source}" if source is not None else "the pickle"
        super().__init__(
            f"{where} asks for {module}.{name} (module {module!r}, name {name!r}), which is refused: it is not "
            f"plain data and would be imported and called. Accepted: dict, list, tuple, str, bytes, int, float, bool, "
            f"None, and the globals {', '.join(sorted(ACCEPTED_GLOBALS))}")


class PickledObject:
    """An instance of a class a pickle names, as plain data: the class is never imported.

    `pickled_name` is the `module.name` the pickle gave; the attributes the pickle set (its `__dict__`) are this
    object's attributes; `pickled_args` (and `pickled_kwargs`) are the arguments it was created or called with,
    and `pickled_state` a state that was not a dictionary of attributes (None when there was none).
    """
    pickled_name = ''

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        obj.__dict__.update(pickled_args=args, pickled_kwargs=kwargs, pickled_state=None)
        return obj

    def __init__(self, *args, **kwargs):
        pass  # `REDUCE` calls the class: the arguments were kept by `__new__`

    def __setstate__(self, state):
        # `BUILD`: a dict of attributes, or (attributes, slot values) for classes with `__slots__`
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            merged = dict(state[0] or {})
            merged.update(state[1] or {})
            state = merged
        if isinstance(state, dict) and all(isinstance(k, (str, bytes)) for k in state):
            # Python 2's attribute names arrive as bytes when strings are read as bytes
            self.__dict__.update((k.decode('ascii') if isinstance(k, bytes) else k, v) for k, v in state.items())
        else:
            self.__dict__['pickled_state'] = state

    def __repr__(self) -> str:
        names = [k for k in vars(self) if k not in ('pickled_args', 'pickled_kwargs', 'pickled_state')]
        return f"<pickled {self.pickled_name} with attributes {', '.join(names) or '(none)'}>"


def _stand_in(qualified_name: str) -> type:
    """A `PickledObject` class for `module.name`."""
    return type(qualified_name.rsplit('.', 1)[1], (PickledObject,),
                {'pickled_name': qualified_name, '__module__': __name__})


# numpy's dtype codes (kind and size in bytes) that have a torch dtype
_NUMPY_TO_TORCH = {'b1': torch.bool, 'i1': torch.int8, 'u1': torch.uint8, 'i2': torch.int16, 'i4': torch.int32,
                   'i8': torch.int64, 'f2': torch.float16, 'f4': torch.float32, 'f8': torch.float64}


def _text(value) -> str:
    return value.decode('latin-1') if isinstance(value, (bytes, bytearray)) else value


class NumpyDtype(PickledObject):
    """`numpy.dtype(code, align, copy)` with its state `(version, byte order, ...)`, as the pickle gives them."""
    pickled_name = 'numpy.dtype'

    def torch_dtype(self) -> Tuple[torch.dtype, str]:
        """The torch dtype and the byte order (`'<'`, `'>'`, `'|'` or `'='`) of this numpy dtype."""
        code = _text(self.pickled_args[0]) if self.pickled_args else None
        order = _text(self.pickled_state[1]) if isinstance(self.pickled_state, tuple) and \
            len(self.pickled_state) > 1 else '='
        if code not in _NUMPY_TO_TORCH:
            raise pickle.UnpicklingError(
                f"a numpy array of dtype {code!r} is not read: only {', '.join(_NUMPY_TO_TORCH)} arrays have a torch "
                f"dtype (an object array, 'O', would hold pickled objects)")
        return _NUMPY_TO_TORCH[code], order


class NumpyArray(PickledObject):
    """A numpy array of a pickle, rebuilt from its raw bytes as a torch tensor (`tensor`) without numpy.

    numpy pickles an array as `_reconstruct(ndarray, (0,), b'b')` followed by the state
    `(version, shape, dtype, is_fortran_order, raw bytes)` (4 items before numpy's version 1 of the format).
    """
    pickled_name = 'numpy.ndarray'
    tensor: Optional[torch.Tensor] = None

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]
        if not (isinstance(state, tuple) and len(state) == 4 and isinstance(state[1], NumpyDtype)):
            raise pickle.UnpicklingError(f"a numpy array's state is {type(state).__name__}: expected "
                                         f"(shape, dtype, is_fortran_order, raw bytes)")
        shape, dtype, fortran_order, raw = state
        dtype, order = dtype.torch_dtype()
        if isinstance(raw, str):
            raw = raw.encode('latin-1')  # a Python 2 `str` read as text: latin-1 maps each char back to its byte
        if not isinstance(raw, (bytes, bytearray)):
            raise pickle.UnpicklingError(f"a numpy array's data is {type(raw).__name__}: expected bytes")
        shape = tuple(shape)
        item_size = torch.empty((), dtype=dtype).element_size()
        count = 1
        for n in shape:
            count *= n
        if len(raw) != count * item_size:
            raise pickle.UnpicklingError(f"a numpy array of shape {shape} and {item_size}-byte items has "
                                         f"{len(raw)} bytes of data: expected {count * item_size}")
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        native = '<' if sys.byteorder == 'little' else '>'
        if order in '<>' and order != native and item_size > 1:
            flat = flat.reshape(-1, item_size).flip(1).reshape(-1)
        values = flat.view(dtype)
        if fortran_order:  # column-major: the reversed shape, transposed
            self.tensor = values.reshape(shape[::-1]).permute(*reversed(range(len(shape)))).contiguous()
        else:
            self.tensor = values.reshape(shape)


class _NumpyNdarrayType:
    """Stands for the class `numpy.ndarray`, which the pickle passes to `_reconstruct`."""


def _numpy_reconstruct(subtype, shape, dtype_code) -> NumpyArray:
    """`numpy.core.multiarray._reconstruct`: an empty array, which the pickle's state then fills."""
    if subtype is not _NumpyNdarrayType:
        raise pickle.UnpicklingError(f"numpy's _reconstruct was asked for {subtype!r}: only numpy.ndarray is read")
    return NumpyArray()


def _latin1_bytes(text, encoding) -> bytes:
    """`_codecs.encode(text, 'latin1')`: how protocol 2 writes `bytes` so that Python 2 can read them."""
    if not isinstance(text, str) or encoding not in ('latin1', 'latin-1'):
        raise pickle.UnpicklingError(f"_codecs.encode({text!r:.40}, {encoding!r}) is refused: only the protocol-2 "
                                     f"form of bytes, _codecs.encode(<str>, 'latin1'), is read")
    return text.encode('latin-1')


def _empty_bytes(*args) -> bytes:
    """`bytes()`: how protocol 2 writes `b''`."""
    if args:
        raise pickle.UnpicklingError(f"bytes{args!r:.40} is refused: only the protocol-2 form of b'', bytes(), is read")
    return b''


_TRANSFO_XL_CLASSES = [
    'data_utils.Corpus', 'utils.vocabulary.Vocab', 'vocabulary.Vocab',
    # what transformers 4.44's `TransfoXLTokenizer.save_vocabulary` pickles beside the vocabulary
    're._compile', 'sacremoses.normalize.MosesPunctNormalizer', 'sacremoses.tokenize.MosesTokenizer',
    'sacremoses.tokenize.MosesDetokenizer', 'transformers.tokenization_utils.Trie', 'tokenizers.AddedToken',
]

ACCEPTED_GLOBALS: Dict[str, Any] = {
    'collections.Counter': Counter,
    'collections.OrderedDict': OrderedDict,
    'builtins.set': set, 'builtins.frozenset': frozenset,
    '__builtin__.set': set, '__builtin__.frozenset': frozenset,
    '_codecs.encode': _latin1_bytes, 'builtins.bytes': _empty_bytes, '__builtin__.bytes': _empty_bytes,
    'numpy.core.multiarray._reconstruct': _numpy_reconstruct,
    'numpy._core.multiarray._reconstruct': _numpy_reconstruct,
    'numpy.ndarray': _NumpyNdarrayType,
    'numpy.dtype': NumpyDtype,
    'torch._utils._rebuild_tensor_v2': torch._utils._rebuild_tensor_v2,
    **{name: _stand_in(name) for name in _TRANSFO_XL_CLASSES},
}
"""Every `module.name` a pickle may ask for, and what it gets instead of the import."""


class Unpickler(pickle.Unpickler):
    """`pickle.Unpickler` that answers globals from `ACCEPTED_GLOBALS` only and imports nothing.

    Python 2's strings (`str`, which held the bytes of UTF-8 text) are read as `bytes` unless `encoding` says
    otherwise, so that no text is decoded with a guessed codec; the callers decode them.
    """

    def __init__(self, file, *, encoding: str = 'bytes', **kwargs):
        super().__init__(file, encoding=encoding, **kwargs)

    def find_class(self, module: str, name: str):
        found = ACCEPTED_GLOBALS.get(f'{module}.{name}')
        if found is None:
            raise ForbiddenGlobalError(module, name)
        return found


def load(file, **kwargs):
    """`pickle.load` with `Unpickler`: one pickle from the open binary `file`. (`torch.load` calls this too.)"""
    return Unpickler(file, **kwargs).load()


def loads(data: bytes, **kwargs):
    """`pickle.loads` with `Unpickler`."""
    return load(io.BytesIO(data), **kwargs)


def _refuse_torchscript(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        records = [name.split('/', 1)[-1] for name in archive.namelist()]
    if 'constants.pkl' in records or any(r.startswith('code/') for r in records):
        raise DataFileFormatError(f"{path} is a TorchScript archive, which holds code (torch.load would run it "
                                  f"with torch.jit.load): only torch.save files and plain pickles of data are read")


def _torch_load(path: Path):
    return torch.load(path, map_location='cpu', pickle_module=sys.modules[__name__], weights_only=False)


def load_file(path: Union[str, Path]):
    """The data of a plain pickle or a `torch.save` file (zip or the legacy format before torch 1.6).

    Args:
        path: the file

    Raises `ForbiddenGlobalError` (naming the file and the global) when it asks for anything but data,
    `DataFileFormatError` when it is not a pickle, `MissingDataFileError` when it is not there.
    """
    path = require_file(path, 'pickle file')
    try:
        if zipfile.is_zipfile(path):
            _refuse_torchscript(path)
            return _torch_load(path)
        with open(path, 'rb') as f:
            first = load(f)
        # The legacy torch.save format starts with pickles of a magic number and its protocol version
        if isinstance(first, int) and first == torch.serialization.MAGIC_NUMBER:
            return _torch_load(path)
        return first
    except ForbiddenGlobalError as e:
        raise ForbiddenGlobalError(e.module, e.name, source=path) from None
    except DataFileFormatError:
        raise
    except Exception as e:  # a damaged or foreign file fails anywhere in the unpickler; say which file it was
        raise DataFileFormatError(f"{path} could not be read as a pickle or torch.save file of data: "
                                  f"{type(e).__name__}: {e}") from e
