"""One naming rule for the registered operators (issue 51 item 2; ``docs/architecture.md``, "Names").

The Python object of the op ``sparsenorm::X`` is called ``X`` in its module, or ``X_op`` exactly when
that module also has a public callable ``X``: the op's checked, differentiable wrapper (defaults,
argument checks, optional outputs), which callers use. So ``X`` / ``X_op`` is the only pair of
names for one op, and every registered op has its object on the op layer."""
import importlib
import pkgutil

import pytest
import torch
from torch._library.custom_ops import CustomOpDef

import sparsenorm  # noqa: F401 (registers the ops)
import sparsenorm.kernels.ops as ops_package


def op_objects():
    """``(module name, attribute name, op name)`` for every op object defined on the op layer."""
    found = []
    for info in pkgutil.iter_modules(ops_package.__path__):
        module = importlib.import_module(f"{ops_package.__name__}.{info.name}")
        for attribute, value in vars(module).items():
            if isinstance(value, CustomOpDef) and value._namespace == "sparsenorm":
                found.append((module.__name__, attribute, value._name, module))
    return found


OBJECTS = op_objects()


def registered_ops():
    return {name for name in dir(torch.ops.sparsenorm) if isinstance(getattr(torch.ops.sparsenorm, name, None),
                                                                     torch._ops.OpOverloadPacket)}


def test_every_registered_op_has_its_object_on_the_op_layer():
    defined = {op for _, _, op, _ in OBJECTS}
    assert registered_ops() - defined == set()
    assert len(defined) >= 20  # the walk found the op layer (a rename of the package would empty it)


@pytest.mark.parametrize("module_name, attribute, op, module", OBJECTS, ids=[f"{o[0]}.{o[1]}" for o in OBJECTS])
def test_op_object_is_named_by_the_rule(module_name, attribute, op, module):
    wrapper = getattr(module, op, None)
    has_wrapper = callable(wrapper) and not isinstance(wrapper, CustomOpDef)
    expected = f"{op}_op" if has_wrapper else op
    if attribute.startswith("_"):  # a private alias of an op defined (and checked) under its public name
        assert any(a == expected and o == op for m, a, o, _ in OBJECTS if m == module_name)
        return
    assert attribute == expected, (f"{module_name}.{attribute} is the op sparsenorm::{op}: call it {expected!r} "
                                   f"({'the module has the wrapper ' + op if has_wrapper else 'no wrapper ' + op})")
