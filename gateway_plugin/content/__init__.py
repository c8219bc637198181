"""What keeps a request home by its text: the detectors and patterns (``detectors``), compiled
into one program (``program``, ``syntax``) that reads a request's inputs as the model will
(``checks``)."""
