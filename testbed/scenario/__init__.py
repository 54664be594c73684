"""The scenario runner: build, start roles, replay, inject faults, collect, report."""
