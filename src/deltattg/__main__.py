from deltattg.cli import main

raise SystemExit(main())
