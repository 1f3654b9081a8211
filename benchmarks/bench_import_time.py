"""From a fresh Python process to the first ``write()`` of a WAL-only task.

A subprocess unpickles the driver's writer (cloudpickle, as Spark ships it) and
``write()``s 5,000 rows, vs ``import lance`` + ``write_dataset`` and an empty process:
seconds from launch, and the heavy modules (lance, pandas...) the import and write load.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from memwal_datasource import MemWalDataSource

from . import harness as h

NAME = "import_time"
HEAVY = ("lance", "pandas", "numpy", "pyarrow.dataset", "pyspark.sql.connect", "obstore",
         "boto3")
SCRIPT = """
import json, pickle, sys, time, pyspark.sql.datasource, pyarrow as pa
t, kind = {"worker_ready": time.time()}, sys.argv[1]
heavy = lambda: [m for m in HEAVY if m in sys.modules]
rows = pa.ipc.open_file(sys.argv[2]).read_all()
if kind == "memwal":
    w = pickle.load(open(sys.argv[3], "rb"))
elif kind == "lance":
    import lance
t["imported"], t["heavy_after_import"] = time.time(), heavy()
if kind == "memwal":
    w.write(iter(rows.to_batches()))
elif kind == "lance":
    lance.write_dataset(rows, sys.argv[3], mode="append")
t["written"], t["heavy_after_write"] = time.time(), heavy()
print(json.dumps(t))
""".replace("HEAVY", repr(HEAVY))


def run(ctx: h.Ctx) -> dict[str, Any]:
    import lance

    root = ctx.scratch("import")
    rows, table, lance_uri = str(root / "rows.arrow"), str(root / "t.lance"), str(root / "l.lance")
    with pa.OSFile(rows, "wb") as f, pa.ipc.new_file(f, h.SCHEMA) as w:
        w.write_table(h.arrow_rows(0, 5_000))
    h.inproc_append(table, h.arrow_rows(0, 5_000))  # the table exists, as for any append
    lance.write_dataset(h.arrow_rows(0, 5_000), lance_uri)

    def fresh(kind: str):
        def run(r: int) -> dict[str, Any]:
            arg = str(root / "writer.pkl") if kind == "memwal" else lance_uri
            if kind == "memwal":  # the driver's writer (a new job), pickled as Spark ships it
                writer = MemWalDataSource({"path": table}).writer(h.spark_schema(), False)
                (root / "writer.pkl").write_bytes(cloudpickle.dumps(writer))
            t0 = time.time()
            out = subprocess.run([sys.executable, "-c", SCRIPT, kind, rows, arg], check=True,
                                 capture_output=True, text=True, cwd=h.REPO_ROOT)
            t = json.loads(out.stdout.strip().splitlines()[-1])
            return {"to_first_write_s": t["written"] - t0, "worker_start_s": t["worker_ready"] - t0,
                    "import_s": t["imported"] - t["worker_ready"],
                    "write_s": t["written"] - t["imported"], **{
                        k: t[k] for k in ("heavy_after_import", "heavy_after_write")}}
        return run

    names = {"memwal": "memwal WAL-only task (unpickle writer + write)",
             "lance": "import lance + write_dataset append", "none": "nothing (the floor)"}
    runs = h.alternate(ctx, {names[k]: fresh(k) for k in names})
    comp, mem, lance_name = h.stats(runs), runs[names["memwal"]][-1], names["lance"]
    for n, rs in runs.items():
        comp[n]["heavy"] = f"{rs[-1]['heavy_after_import']} / {rs[-1]['heavy_after_write']}"
    return h.local_case(
        "Fresh process to the first write() of a WAL-only task",
        {"rows": 5_000, "baseline": "every process imports pyspark.sql.datasource and pyarrow "
                                    "first, as a Spark worker has"}, comp,
        [*((k.replace("_s", " s").replace("_", " "), k, "{:.3g}") for k in (
            "to_first_write_s", "worker_start_s", "import_s", "write_s")),
         ("heavy modules after import / after write", "heavy", "{}")],
        [h.target("memwal task / lance append: launch to first write", h.ratios(
            runs, names["memwal"], "to_first_write_s", [lance_name])[lance_name]),
         {"what": "a WAL-only task loads neither lance nor pandas",
          "value": comp[names["memwal"]]["heavy"],
          "met": not {"lance", "pandas"} & set(mem["heavy_after_write"])}],
        [("launch to first write", "to_first_write_s", "s")], competitors=comp)
