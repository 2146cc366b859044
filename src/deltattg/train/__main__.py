from deltattg.train.cli import main

raise SystemExit(main())
