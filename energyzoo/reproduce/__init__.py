"""`energyzoo reproduce NAME`: the paper experiments at CPU scale, one file each (`experiments` is their table), judged
by one verdict rule (`verdict`), written as reports and assembled into the ledger (`report`); long runs resume by part
(`parts`) and split over processes (`processes`)."""
