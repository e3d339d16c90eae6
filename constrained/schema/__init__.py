"""JSON-Schema algebra: pure functions over schemas and JSON text, no vLLM, no grammar backend.

The grammar backends (``constrained.grammars``) use it to decide what a schema asks and what
they can enforce; it never imports them.

Modules:

- ``user_input``: user input (JSON text, dict, pydantic class) to checked schema text;
  ``close_objects``.
- ``walk``: walking a schema: subschemas, ``$ref`` pointers, types.
- ``negation``: exact negation and disjointness of schemas (``negate``, ``apart``).
- ``rewrite``: keywords no backend enforces, rewritten exactly into ones they do.
- ``allow_list``: ``AllowList``, refusals for backends that ignore what they do not enforce.
- ``array_checks``: ``uniqueItems`` / ``contains`` planned per instance location
  (``plan_checks``), for the matcher that checks them while the output is written.
- ``json_scan``: following JSON text byte by byte, and each token's reach.
"""
