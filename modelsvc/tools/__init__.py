"""Tools around modelsvc that are not the server or the client: ``stubgen`` writes typed model wrappers."""
