"""Tests of the ``memwal`` CLI (memwal_datasource/cli/)."""
