"""``--calibration auto``'s text: short paragraphs of plain English on many everyday topics, written for modelsvc.

It gives an English text model activation ranges like those of real text (a service with text of its own, its
documents or queries, should pass that instead: ``--calibration FILE``).
"""

from __future__ import annotations

__all__ = ["TEXTS"]

TEXTS = (
    "The city council voted on Tuesday to extend the tram line to the airport, a project expected to take four "
    "years and cost about 600 million euros.",
    "Heavy rain flooded several streets in the old town overnight; firefighters pumped water out of basements "
    "until the early morning.",
    "The team came back from two goals down to draw 2-2, and their coach said the second half was the best they "
    "had played all season.",
    "She finished the marathon in just under three hours, eleven minutes faster than her previous best.",
    "Quarterly revenue rose 12 percent to 3.4 billion dollars, helped by strong sales of cloud services, while "
    "operating costs grew more slowly.",
    "Oil prices fell for a third day as traders weighed rising stockpiles against hopes of stronger demand in "
    "the spring.",
    "The bank kept its main interest rate unchanged and said inflation was likely to return to target next year.",
    "Small businesses say higher energy bills and a shortage of skilled workers are their two biggest worries.",
    "The update fixes a memory leak in the database driver and makes startup about twice as fast on large "
    "projects.",
    "Researchers trained the language model on a mix of books, web pages and source code, then tuned it to follow "
    "instructions.",
    "To reset the router, hold the small button on the back for ten seconds until the lights blink orange.",
    "The new laptop has a larger battery, a quieter fan and two more USB ports than last year's model.",
    "Engineers found that the outage began when a configuration change removed a route between two data centers.",
    "Astronomers observed a star being torn apart by a black hole in a galaxy 300 million light years away.",
    "The experiment showed that the bacteria share genes with their neighbours far more often than expected.",
    "A team of geologists drilled through the ice sheet and brought up rock that had not seen daylight for a "
    "million years.",
    "Measurements from the probe suggest the moon's ocean is salty and may be warmer near the sea floor.",
    "Patients who walked for thirty minutes a day recovered from surgery faster than those who rested in bed.",
    "The clinic will offer free vaccinations on Saturday mornings through the end of the winter.",
    "Doctors recommend drinking water regularly during hot weather, especially for children and older people.",
    "The study followed ten thousand adults for twenty years and linked poor sleep to a higher risk of heart "
    "disease.",
    "Parliament approved the budget by a narrow margin after the government agreed to raise pensions.",
    "The two countries signed a trade agreement that removes tariffs on farm products over the next five years.",
    "Voters will elect a new mayor in June; the three main candidates debated housing and public transport.",
    "The minister resigned after a report found that public money had been used for private travel.",
    "Mix the flour, sugar and a pinch of salt, then add the butter and rub it in until the mixture looks like "
    "breadcrumbs.",
    "Roast the vegetables at 200 degrees for forty minutes, turning them once, until they are golden at the "
    "edges.",
    "The museum's new wing shows paintings from the nineteenth century alongside photographs of the same streets "
    "today.",
    "Her second novel follows three sisters who return to their family's farm after their father's death.",
    "The orchestra opened the festival with a symphony that had not been performed in the city for fifty years.",
    "The train to the coast leaves every hour from platform four; tickets bought online are cheaper.",
    "Hikers should carry warm clothes and enough water, since the weather in the mountains can change quickly.",
    "The hotel is a short walk from the beach and has a garden where breakfast is served in summer.",
    "Please find attached the invoice for March. Payment is due within thirty days of the invoice date.",
    "Thank you for your order. Your package has shipped and should arrive within three to five working days.",
    "If you have forgotten your password, click the link below and follow the instructions to choose a new one.",
    "The meeting has been moved to Thursday at 10:30 in room 2B; the agenda is unchanged.",
    "Students must submit their projects by Friday, and late work will lose ten percent of its marks per day.",
    "The school is adding evening classes in programming and accounting for adults who want to change careers.",
    "Teachers say smaller classes help them give each pupil more attention, especially in the first years.",
    "Farmers expect a smaller wheat harvest this year after a dry spring and a week of hail in June.",
    "The forest service planted forty thousand trees on hillsides that burned two summers ago.",
    "Wind and solar power produced more electricity than coal in the country for the first time last year.",
    "The court ruled that the company must pay compensation to workers who were dismissed without notice.",
    "Police are asking anyone who saw the accident on the bridge on Sunday evening to come forward.",
    "The new law requires landlords to register rental homes and to fix safety problems within a month.",
    "The striker signed a three-year contract and will wear the number nine shirt next season.",
    "Rain delayed the final set for two hours, but the match ended before midnight with a win for the champion.",
    "The cycling race will pass through the valley on Wednesday, and several roads will close for the afternoon.",
    "An old map found in the library shows the harbour as it was before the great fire of 1842.",
    "Historians believe the letters were written by a soldier to his sister during the long winter of the war.",
    "The festival drew more than eighty thousand visitors over three days, a record for the small town.",
    "Customer: my card was charged twice for the same order. Agent: I am sorry about that; I have refunded the "
    "second payment.",
    "The app crashes when I open the settings page on my phone. It started after yesterday's update.",
    "Insurance premiums for drivers under twenty-five rose sharply, according to a survey of the ten largest "
    "insurers.",
    "The housing market cooled in the autumn as higher mortgage rates kept first-time buyers away.",
    "The company plans to open two factories abroad and hire around 1,500 people by the end of next year.",
    "A volcano on the island erupted on Monday, sending ash five kilometres into the sky and closing the airport.",
    "The bridge, built in 1931, will close for repairs for eight months starting in September.",
    "Scientists warn that warmer seas are pushing fish stocks north, changing where fishing fleets can work.",
)
