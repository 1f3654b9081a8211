"""The library installs no log handler of its own; the CLI (an application) may."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Runs what a Spark driver, a commit worker and a compaction import and call.
PROBE = textwrap.dedent("""
    import logging
    import memwal_datasource
    import memwal_datasource.spark
    from memwal_datasource.spark import writer  # noqa: F401 - the commit path loaded

    ours = logging.getLogger("memwal_datasource")
    print([type(h).__name__ for h in ours.handlers], logging.getLogger().handlers,
          ours.level)
""")


def test_importing_and_committing_installs_no_handler():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split("\n")[0] == "['NullHandler'] [] 0", done.stdout + done.stderr


def test_an_application_that_configures_logging_sees_our_records():
    probe = textwrap.dedent("""
        import logging
        logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
        import memwal_datasource
        logging.getLogger("memwal_datasource.log.commit").info("hello")
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    assert "memwal_datasource.log.commit hello" in done.stderr


def test_the_cli_configures_logging_for_its_own_output(tmp_path):
    probe = textwrap.dedent("""
        import logging, sys
        from memwal_datasource import cli
        sys.argv = ["memwal", "shards", sys.argv[1]]
        try:
            cli.run()
        except SystemExit:
            pass
        logging.getLogger("memwal_datasource.shard.manifest").warning("a warning")
    """)
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)
    assert "memwal: WARNING: a warning" in done.stderr
    assert "no memwal table at" in done.stderr
