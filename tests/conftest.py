"""Test-suite order: the JAX backend's in-process tests run last.

Importing JAX starts its thread pools, and a process that has them must not fork without
exec (os.fork() then warns that it "will likely lead to a deadlock"); the what-if engine's
tests fork worker processes (planner/whatif/engine.py). Running tests/jaxrt/ after every
other package keeps JAX out of the pytest process until nothing forks any more."""


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: "/tests/jaxrt/" in str(item.path).replace("\\", "/"))
