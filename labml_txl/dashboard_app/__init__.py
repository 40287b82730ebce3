"""Helpers of `python -m labml_txl.dashboard`: the file store and the locally served page assets.

* `store`  puts labml_app's models and indexes in files under a data directory, in place of MongoDB.
* `assets` finds d3 v6, Bootstrap and Font Awesome on this machine and rewrites the app's page to load
  them from local routes, leaving a public CDN link only for what is missing.

`labml_txl.dashboard` assembles them with labml_app; nothing here imports labml_app at import time.
"""
