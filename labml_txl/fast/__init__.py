"""Speed, behind one boundary: the dispatcher that chooses an implementation for every call (`dispatch.py`), our C++
kernels (`native/`), oneDNN's prepacked products, dropout with 16-bit masks, and the version counters that say when a
value kept from parameters is stale. Model code computes the same numbers without any of it (`impl='reference'`)."""
