"""Where each request goes: the policy's types (``model``), its one pure decision (``decide``), the
overflow estimate it reads (``overflow``) and how the config compiles into it (``build``). No I/O,
no clock: everything arrives in a ``snapshot``."""
