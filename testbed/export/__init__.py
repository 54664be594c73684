"""Export a scenario to Kubernetes with Chaos Mesh, and collect the results back.

Layering as elsewhere: pure builders from the spec to plain data
(``timeline`` -> ``chaos``, ``manifests``, assembled by ``build``),
serialised once (``write``); ``inpod`` is what runs inside the pods;
``collect`` turns the copied results into a run directory for
``testbed report``. Nothing here imports the emulated network
(``testbed.net``). docs/scale-out.md maps every field.
"""
