"""A stand-in for an installed safetensors package (the real one is not
installable here): the names wcache.install() patches, each refusing to run,
so a test sees whether a call went to wcache or to "upstream"."""


class SafetensorError(Exception):
    pass


class safe_open:
    def __init__(self, *args, **kwargs):
        raise AssertionError("upstream safe_open called")
