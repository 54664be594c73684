"""Benchmark harnesses that run roles over the emulated network (they import net/ and spec/; the roles never do)."""
