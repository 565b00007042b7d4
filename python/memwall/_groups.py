"""How memwall groups a torch model's parameters into flat groups, one rule
for memwall.torch.ZeroOptimizer (the groups it registers) and memwall.trace
(the groups a traced description declares, so that a dry run holds the
model states a real run holds)."""


def module_groups(model):
    """The model's parameters by owning module, in module order: each
    parameter belongs to the module named_parameters() meets it under
    first (a shared one, such as a tied embedding, to its first user); a
    module's own parameters make a group of its trainable ones, then one
    of its frozen ones. Yields (module, label, [(full name, parameter)],
    trainable) per non-empty group; the label is the module's name ("<model>"
    for the root), with " (frozen)" for frozen ones."""
    owner, names = {}, {}
    for full, p in model.named_parameters():
        owner.setdefault(id(p), full.rpartition(".")[0])
        names.setdefault(id(p), full)
    for module_name, module in model.named_modules():
        own = [p for p in module._parameters.values()
               if p is not None and owner[id(p)] == module_name]
        for trainable in (True, False):
            members = [(names[id(p)], p) for p in own if p.requires_grad == trainable]
            if members:
                label = (module_name or "<model>") + ("" if trainable else " (frozen)")
                yield module, label, members, trainable


def owners(model):
    """{id(parameter): the name of the module that owns it} (module_groups'
    rule)."""
    owner = {}
    for full, p in model.named_parameters():
        owner.setdefault(id(p), full.rpartition(".")[0])
    return owner
