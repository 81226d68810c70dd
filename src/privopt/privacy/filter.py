class RdpFilter:
    pass
