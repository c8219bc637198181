"""One request through the ext-plugin runner: the plugin that reads it (``spillway``), the headers it
trusts (``reading``, ``header_names``), the content checks and the audit record."""
