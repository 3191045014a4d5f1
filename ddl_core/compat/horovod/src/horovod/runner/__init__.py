"""`horovodrun`: Horovod's launcher options translated to `ddlrun`."""
