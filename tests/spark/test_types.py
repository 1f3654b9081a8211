"""Every Spark SQL type the Arrow path carries, in both modes.

Each is written and read back equal, or refused on the driver, before any
task, naming the column and the reason. One table per mode holds every
supported column; every column is null in one row.
"""

from __future__ import annotations

import pytest

from tests.spark.test_source import assert_refused
from tests.spark.test_writer import MODES, read, write

TZ_KEY = "spark.sql.session.timeZone"
WRITE_TZ = "America/New_York"  # not UTC: Spark hands zoned timestamps over in this zone
TYPES = {  # column -> SQL over id
    "c_byte": "cast(id - 3 as tinyint)",
    "c_short": "cast(id * 1000 as smallint)",
    "c_int": "cast(id * 100000 as int)",
    "c_long": "id * 1000000000000",
    "c_float": "cast(id as float) / 4",
    "c_double": "cast(id as double) / 3",
    "c_decimal": "cast(id * 1.25 as decimal(10,2))",
    "c_decimal38": "cast(id / 7 as decimal(38,10))",
    "c_string": "concat('s', id, ' ü [b]')",
    "c_binary": "cast(concat('b', id) as binary)",
    "c_boolean": "id % 2 = 0",
    "c_date": "date_add(date'2024-02-28', cast(id as int))",
    # Across New York's DST change (2024-03-10 02:00 local does not exist).
    "c_timestamp": "timestamp'2024-03-10 01:30:00' + make_interval(0, 0, 0, 0, id, 0, 0)",
    "c_timestamp_ntz": "timestamp_ntz'2024-03-10 01:30:00' + make_interval(0, 0, 0, 0, id, 0, 0)",
    "c_interval": "make_dt_interval(0, 0, 0, id * 1.5)",
    "c_array": "array(id, null, id + 1)",
    "c_array_ts": "array(timestamp'2024-01-01 00:00:00' + make_interval(0, 0, 0, id, 0, 0, 0))",
    "c_struct": "named_struct('x', id, 's', cast(id as string), 'd', cast(id as decimal(12,3)))",
    "c_map": "map(cast(id as string), cast(id as decimal(20,4)))",
    "c_variant": "parse_json(concat('{\"a\": ', id, ', \"b\": [1, \"x\"]}'))",
    "c_void": "null",
}
# VariantVal has no equality: compare its JSON text.
COMPARE = ["id", *[f"to_json({c}) as {c}" if c == "c_variant" else c for c in TYPES]]


def all_types(spark):
    """Six rows over two partitions; row 3 is null in every column but id."""
    exprs = [f"if(id = 3, null, {e}) as {c}" for c, e in TYPES.items()]
    return spark.range(0, 6, numPartitions=2).selectExpr("id", *exprs)


@pytest.fixture
def session_tz(spark):
    """Run with a non-UTC session time zone, restored afterwards."""
    before = spark.conf.get(TZ_KEY)
    spark.conf.set(TZ_KEY, WRITE_TZ)
    yield
    spark.conf.set(TZ_KEY, before)


@pytest.mark.parametrize("memtable", MODES)
def test_every_type_round_trips(spark, tmp_path, session_tz, memtable):
    uri = str(tmp_path / "t.lance")
    df = all_types(spark)
    write(df, uri, {}, enable_memtable=memtable, primary_key="id")
    back = read(spark, uri, {})
    assert [(f.name, f.dataType) for f in back.schema] == \
        [(f.name, f.dataType) for f in df.schema]
    want = df.selectExpr(*COMPARE).orderBy("id").collect()
    got = back.selectExpr(*COMPARE).orderBy("id").collect()
    assert got == want
    assert got[3].c_timestamp is None and got[3].c_map is None and got[2].c_decimal is not None
    # A second job into the existing table (its timestamps are stored as UTC).
    write(df.selectExpr("id + 6 as id", *TYPES), uri, {}, enable_memtable=memtable)
    assert read(spark, uri, {}).count() == 12
    # Stored as instants: read in another zone, the same microseconds since the epoch.
    micros = df.selectExpr("id", "unix_micros(c_timestamp) as us").orderBy("id").collect()
    spark.conf.set(TZ_KEY, "UTC")
    again = read(spark, uri, {}).where("id < 6").selectExpr(
        "id", "unix_micros(c_timestamp) as us").orderBy("id").collect()
    assert again == micros


@pytest.mark.parametrize("memtable", MODES)
@pytest.mark.parametrize("expr, column, match", [
    ("make_ym_interval(1, 2)", "c_ym",
     "column 'c_ym' has type interval year to month, which Spark's Arrow path cannot carry"),
    ("true", "_tombstone", "column '_tombstone' is reserved: it marks deleted rows"),
    ("true", "_Tombstone", "column '_Tombstone' is reserved"),
])
def test_unsupported_columns_are_refused_on_the_driver(spark, tmp_path, memtable, expr, column,
                                                       match):
    uri = str(tmp_path / "t.lance")
    df = spark.range(0, 3).selectExpr("id", f"{expr} as {column}")
    assert_refused(spark, uri, {}, df, match, enable_memtable=memtable, primary_key="id")
    assert not (tmp_path / "t.lance").exists()  # refused before anything was created


def test_metadata_columns_clash_is_refused(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    write(spark.range(0, 3).selectExpr("id", "'x' as _shard_id"), uri, {},
          enable_memtable="false")
    assert read(spark, uri, {}).count() == 3
    with pytest.raises(Exception, match="option 'metadata_columns' adds column"):
        read(spark, uri, {}, metadata_columns="true").collect()
