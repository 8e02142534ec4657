"""An independent reader of a store: rocksdict (RocksDB's Python binding, from PyPI) lists the
store's column families, opens it read-only with all of them, and prints every entry as hex JSON:
{"families": [...], "data": {"<family>": [["<key hex>", "<value hex>"], ...]}}.

usage: read_store.py STORE_DIR
"""

import json
import sys

from rocksdict import AccessType, Options, Rdict

path = sys.argv[1]
families = Rdict.list_cf(path, Options(raw_mode=True))
db = Rdict(
    path,
    options=Options(raw_mode=True),
    column_families={f: Options(raw_mode=True) for f in families if f != "default"},
    access_type=AccessType.read_only(),
)
out = {"families": sorted(families), "data": {}}
for family in families:
    handle = db if family == "default" else db.get_column_family(family)
    out["data"][family] = [[k.hex(), v.hex()] for k, v in handle.items()]
db.close()
print(json.dumps(out))
