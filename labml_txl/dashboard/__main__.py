"""`python -m labml_txl.dashboard`: see `server.py`."""
import sys

from .server import main

sys.exit(main())
