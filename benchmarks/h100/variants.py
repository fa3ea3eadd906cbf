"""Module constants set by name for a benchmark's variants: `name:module.CONST=value,..`
(module a key of the modules given, the value converted to the constant's type: a
tuple of ints written `64x32`, a bool True or False; a variant without settings is the
code as it is)."""
import importlib


class Variants:
    def __init__(self, modules: dict[str, str]):
        self.modules = modules  # short name -> module path
        self.originals = {}     # (module, constant) -> its value before any variant

    def apply(self, spec: str) -> str:
        """Restore every constant, then set the variant's; returns its name."""
        for (module, const), value in self.originals.items():
            setattr(module, const, value)
        name, _, settings = spec.partition(":")
        for setting in filter(None, settings.split(",")):
            key, value = setting.split("=")
            short, const = key.split(".")
            module = importlib.import_module(self.modules[short])
            self.originals.setdefault((module, const), getattr(module, const))
            current = getattr(module, const)
            if isinstance(current, tuple):
                value = tuple(int(v) for v in value.split("x"))
            elif isinstance(current, bool):
                value = {"True": True, "False": False}[value]
            else:
                value = type(current)(value)
            setattr(module, const, value)
        return name
